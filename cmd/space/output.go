package main

import (
	"github.com/spf13/cobra"

	"space/client"
)

// withOutput makes c a verb that gets one value with get and prints it:
// as JSON with -o json, else with text. It adds the -o flag.
func withOutput[T any](g *globals, c *cobra.Command, get func(cmd *cobra.Command, cl *client.Client, args []string) (T, error), text func(T) error) *cobra.Command {
	var output string
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if err := checkOutput(output); err != nil {
			return err
		}
		cl, err := g.client()
		if err != nil {
			return err
		}
		v, err := get(cmd, cl, args)
		if err != nil {
			return err
		}
		if output == "json" {
			return g.printJSON(v)
		}
		return text(v)
	}
	outputFlag(c.Flags(), &output)
	return c
}

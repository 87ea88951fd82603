package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

func newEventsCmd(g *globals) *cobra.Command {
	var (
		opts   client.EventOptions
		follow bool
		asJSON bool
		output string
	)
	c := &cobra.Command{
		Use:   "events [--sandbox ID] [--type T]... [--after CURSOR] [--follow] [--json]",
		Short: "List or follow your sandboxes' lifecycle events",
		Long: `List the lifecycle events of your team's sandboxes, oldest first: every
change of state (created, running, paused, resumed, stopping, deleted, ...)
and checkpoints, snapshots, restores, forks and timeouts, each with who
caused it (actor) and the request it came in.

Each event has a cursor: --after CURSOR lists those that follow it. With
--follow the command prints events as they happen until interrupted (from
--after, or from the oldest kept). --json prints each event as one JSON
object per line with --follow, or the list as JSON without it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			asJSON = asJSON || output == "json"
			cl, err := g.client()
			if err != nil {
				return err
			}
			if follow {
				if !asJSON {
					fmt.Fprintf(g.stdout, eventLine, "CURSOR", "TIME", "TYPE", "SANDBOX", "STATE", "ACTOR", "REASON")
				}
				enc := json.NewEncoder(g.stdout)
				return cl.FollowEvents(cmd.Context(), opts, func(e api.LifecycleEvent) error {
					if asJSON {
						return enc.Encode(e)
					}
					_, err := fmt.Fprintf(g.stdout, eventLine, eventRow(e)...)
					return err
				})
			}
			l, err := cl.Events(cmd.Context(), opts)
			if err != nil {
				return err
			}
			l.Events = nonNil(l.Events)
			if asJSON {
				return g.printJSON(l)
			}
			return g.printTable([]string{"CURSOR", "TIME", "TYPE", "SANDBOX", "STATE", "ACTOR", "REASON"}, func(row func(...any)) {
				for _, e := range l.Events {
					row(eventRow(e)...)
				}
			})
		},
	}
	f := c.Flags()
	f.StringVar(&opts.Sandbox, "sandbox", "", "only this sandbox's events (`ID`)")
	f.StringSliceVar(&opts.Types, "type", nil, "only events of this `type` (repeatable, or comma-separated)")
	f.StringVar(&opts.After, "after", "", "only events after this `cursor`")
	f.IntVar(&opts.Limit, "limit", 0, "at most `N` events (default 100, at most 1000; not with --follow)")
	f.StringVar(&opts.Team, "team", "", "another `team`'s events (admin keys)")
	f.BoolVar(&opts.All, "all", false, "every team's events (admin keys)")
	f.BoolVarP(&follow, "follow", "f", false, "print events as they happen until interrupted")
	f.BoolVar(&asJSON, "json", false, "print JSON (with --follow: one event per line)")
	outputFlag(f, &output)
	return c
}

// eventLine is the format of one followed event: fixed widths, since
// the rows come one at a time.
const eventLine = "%-8s  %-23s  %-12s  %-24s  %-22s  %-28s  %s\n"

// eventRow is the cells of an event's row.
func eventRow(e api.LifecycleEvent) []any {
	state := e.State
	if e.PreviousState != "" {
		state = e.PreviousState + "->" + e.State
	}
	return []any{e.Cursor, e.Time.Local().Format(time.DateTime + ".000"), e.Type, e.SandboxID, state, e.Actor, e.Reason}
}

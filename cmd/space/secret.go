package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

// maxSecretValue is the largest value the server takes.
const maxSecretValue = 64 << 10

func newSecretCmd(g *globals) *cobra.Command {
	return newGroupCmd("secret", "Store, list and delete your team's secrets",
		newSecretCreateCmd(g), newSecretListCmd(g), newSecretRemoveCmd(g))
}

func newSecretCreateCmd(g *globals) *cobra.Command {
	var (
		req       api.CreateSecret
		valueFile string
	)
	c := withOutput(g, &cobra.Command{
		Use:   "create NAME --value-file F --host H [--host H]... [--header NAME [--format F]]",
		Short: "Store a secret of your team (its value is never shown again)",
		Long: `Store a credential of your team under NAME, for sandboxes to use without
ever holding it: their egress gateway adds the value to requests for the
given hosts. The server keeps the value encrypted and never returns it.

The value is read from the file --value-file names, or from stdin with
--value-file - (there is no flag for the value itself: it would end up in
the shell's history and the process list). It is sent byte for byte; a
value sent in a header may not end with a newline, so write it with
printf '%s', not echo.

With --header the gateway sets that header on every request to the hosts,
to --format with {} replaced by the value: --header Authorization
--format "Bearer {}".`,
		Args: cobra.ExactArgs(1),
		PreRunE: func(cmd *cobra.Command, args []string) error {
			if len(req.Hosts) == 0 {
				return usagef("--host is required: the host names the secret may be sent to")
			}
			if req.Format != "" && req.Header == "" {
				return usagef("--format needs --header: it is the header's value")
			}
			return nil
		},
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Secret, error) {
		value, err := g.readSecretValue(valueFile)
		if err != nil {
			return api.Secret{}, err
		}
		req.Name, req.Value = args[0], value
		return cl.CreateSecret(cmd.Context(), req)
	}, g.printSecret)
	f := c.Flags()
	f.StringVar(&valueFile, "value-file", "", "read the value from `file` (- for stdin)")
	f.StringArrayVar(&req.Hosts, "host", nil, "an exact `host` name whose requests may carry the value (repeatable)")
	f.StringVar(&req.Header, "header", "", "send the value in this HTTP `header` (e.g. Authorization)")
	f.StringVar(&req.Format, "format", "", `the header's value, {} standing for the secret's (default "{}")`)
	c.MarkFlagRequired("value-file")
	return c
}

// readSecretValue reads a secret's value from the file at path, or from
// stdin for "-".
func (g *globals) readSecretValue(path string) ([]byte, error) {
	r, what := g.stdin, "stdin"
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("value file: %w", err)
		}
		defer f.Close()
		r, what = f, path
	}
	b, err := io.ReadAll(io.LimitReader(r, maxSecretValue+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read the value from %s: %w", what, err)
	case len(b) == 0:
		return nil, fmt.Errorf("the value from %s is empty", what)
	case len(b) > maxSecretValue:
		return nil, fmt.Errorf("the value from %s is larger than 64 KiB", what)
	}
	return b, nil
}

// printSecret prints a secret's description (it has no value to print).
func (g *globals) printSecret(sc api.Secret) error {
	return g.printFields("name", sc.Name, "hosts", strings.Join(sc.Hosts, ", "),
		"header", secretHeader(sc), "created", g.ago(sc.CreatedAt))
}

// secretHeader shows the header a secret is sent in as its line would
// read, "Authorization: Bearer {}", or "".
func secretHeader(sc api.Secret) string {
	if sc.Header == "" {
		return ""
	}
	return sc.Header + ": " + sc.Format
}

func newSecretListCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your team's secrets (never their values)",
		Args:    cobra.NoArgs,
	}, func(cmd *cobra.Command, cl *client.Client, _ []string) (api.SecretList, error) {
		scs, err := cl.Secrets(cmd.Context())
		return api.SecretList{Secrets: nonNil(scs)}, err
	}, func(l api.SecretList) error {
		return g.printTable([]string{"NAME", "HOSTS", "HEADER", "CREATED"}, func(row func(...any)) {
			for _, sc := range l.Secrets {
				row(sc.Name, strings.Join(sc.Hosts, ","), secretHeader(sc), g.ago(sc.CreatedAt))
			}
		})
	})
}

func newSecretRemoveCmd(g *globals) *cobra.Command {
	c := newEachCmd(g, "rm", "Delete secrets of your team", (*client.Client).DeleteSecret)
	c.Use = "rm NAME..."
	c.Aliases = []string{"delete"}
	return c
}

func newSandboxSecretsCmd(g *globals) *cobra.Command {
	var none bool
	c := withOutput(g, &cobra.Command{
		Use:   "secrets ID (NAME... | --none)",
		Short: "Replace a running sandbox's secret grants",
		Long: `Grant a running sandbox exactly the team's secrets named (--none: no
secret at all) and print the sandbox. A secret it had keeps its
placeholder. A new one gets a placeholder, in the environment of execs
started from now on and in /etc/space/secrets/NAME, and, as at create,
its hosts are added to the sandbox's policy as host:443 unless a rule
allows them there already. A secret left out is no longer replaced by
its gateway and its file goes; the policy keeps its rules (space sandbox
network changes them).`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0:
				return usagef("secrets needs the sandbox's ID")
			case none && len(args) > 1:
				return usagef("--none takes no secret names")
			case !none && len(args) == 1:
				return usagef("name the secrets to grant, or --none to take them all away")
			}
			return nil
		},
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Sandbox, error) {
		return cl.SetSecrets(cmd.Context(), args[0], args[1:])
	}, g.printSandbox)
	c.Flags().BoolVar(&none, "none", false, "take every grant away")
	return c
}

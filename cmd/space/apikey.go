package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

func newAPIKeyCmd(g *globals) *cobra.Command {
	return newGroupCmd("apikey", "Create, list and revoke API keys",
		newAPIKeyCreateCmd(g), newAPIKeyListCmd(g), newAPIKeyRemoveCmd(g))
}

func newAPIKeyCreateCmd(g *globals) *cobra.Command {
	var (
		req    api.CreateAPIKey
		output string
	)
	c := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create an API key and print its secret (only this once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			k, err := cl.CreateAPIKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if output == "json" {
				err = g.printJSON(k)
			} else {
				err = g.printFields("id", k.ID, "team", k.Team, "name", k.Name, "admin", strconv.FormatBool(k.Admin), "secret", k.Secret)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(g.stderr, "space: save the secret now: it cannot be shown again")
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&req.Name, "name", "", "a `name` to recognize the key by")
	f.StringVar(&req.Team, "team", "", "the key's `team` (created when missing); default yours (another team needs an admin key)")
	f.BoolVar(&req.Admin, "admin", false, "make an admin key (needs an admin key)")
	outputFlag(f, &output)
	return c
}

func newAPIKeyListCmd(g *globals) *cobra.Command {
	var team, output string
	c := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List API keys (without their secrets)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			keys, err := cl.APIKeys(cmd.Context(), team)
			if err != nil {
				return err
			}
			if output == "json" {
				return g.printJSON(api.APIKeyList{Keys: nonNil(keys)})
			}
			return g.printTable([]string{"ID", "TEAM", "NAME", "ADMIN", "CREATED"}, func(row func(...any)) {
				for _, k := range keys {
					row(k.ID, k.Team, k.Name, k.Admin, k.CreatedAt.Local().Format(time.DateTime))
				}
			})
		},
	}
	c.Flags().StringVar(&team, "team", "", "another `team`'s keys (needs an admin key)")
	outputFlag(c.Flags(), &output)
	return c
}

func newAPIKeyRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID",
		Aliases: []string{"delete"},
		Short:   "Revoke an API key",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			return cl.DeleteAPIKey(cmd.Context(), args[0])
		},
	}
}

func newQuotaCmd(g *globals) *cobra.Command {
	var team string
	c := withOutput(g, &cobra.Command{
		Use:   "quota",
		Short: "Show a team's limits and usage (yours unless --team, which needs an admin key)",
		Args:  cobra.NoArgs,
	}, func(cmd *cobra.Command, cl *client.Client, _ []string) (api.QuotaUsage, error) {
		return cl.TeamQuota(cmd.Context(), team)
	}, g.printQuota)
	c.Flags().StringVar(&team, "team", "", "the `team` (admin key)")
	c.AddCommand(newQuotaSetCmd(g))
	return c
}

func newQuotaSetCmd(g *globals) *cobra.Command {
	var (
		team string
		q    api.Quota
	)
	c := withOutput(g, &cobra.Command{
		Use:   "set [--team T] [--sandboxes N] [--vcpus N] [--memory MiB] [--snapshots MiB]",
		Short: "Set a team's limits (admin key); 0 or an omitted flag means unlimited",
		Args:  cobra.NoArgs,
	}, func(cmd *cobra.Command, cl *client.Client, _ []string) (api.QuotaUsage, error) {
		return cl.SetQuota(cmd.Context(), team, q)
	}, g.printQuota)
	f := c.Flags()
	f.StringVar(&team, "team", "", "the `team` (default: yours)")
	f.IntVar(&q.Sandboxes, "sandboxes", 0, "sandboxes at once")
	f.IntVar(&q.VCPUs, "vcpus", 0, "vCPUs over all sandboxes")
	f.Int64Var(&q.MemoryMiB, "memory", 0, "`MiB` of guest memory over all sandboxes")
	f.Int64Var(&q.SnapshotMiB, "snapshots", 0, "`MiB` of snapshot storage")
	return c
}

// printQuota prints limits and usage as a table.
func (g *globals) printQuota(q api.QuotaUsage) error {
	limit := func(n int64) string {
		if n == 0 {
			return "unlimited"
		}
		return strconv.FormatInt(n, 10)
	}
	return g.printTable([]string{"RESOURCE", "USED", "LIMIT"}, func(row func(...any)) {
		row("sandboxes", q.Used.Sandboxes, limit(int64(q.Limits.Sandboxes)))
		row("vcpus", q.Used.VCPUs, limit(int64(q.Limits.VCPUs)))
		row("memory_mib", q.Used.MemoryMiB, limit(q.Limits.MemoryMiB))
		row("snapshot_mib", q.Used.SnapshotMiB, limit(q.Limits.SnapshotMiB))
	})
}

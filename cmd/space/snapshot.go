package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

func newSnapshotCmd(g *globals) *cobra.Command {
	return newGroupCmd("snapshot", "Take, list and delete snapshots of sandboxes",
		newSnapshotCreateCmd(g), newSnapshotListCmd(g), newSnapshotGetCmd(g), newSnapshotRemoveCmd(g))
}

func newSnapshotCreateCmd(g *globals) *cobra.Command {
	var name string
	c := withOutput(g, &cobra.Command{
		Use:   "create SANDBOX [--name N]",
		Short: "Take a live snapshot of a sandbox; prints its ID",
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Snapshot, error) {
		return cl.CreateSnapshot(cmd.Context(), args[0], name)
	}, func(sn api.Snapshot) error {
		_, err := fmt.Fprintln(g.stdout, sn.ID)
		return err
	})
	c.Flags().StringVar(&name, "name", "", "a `name` for the snapshot, unique in your team")
	return c
}

func newSnapshotListCmd(g *globals) *cobra.Command {
	var sandbox string
	c := withOutput(g, &cobra.Command{
		Use:     "ls [--sandbox ID]",
		Aliases: []string{"list"},
		Short:   "List snapshots",
		Args:    cobra.NoArgs,
	}, func(cmd *cobra.Command, cl *client.Client, _ []string) (api.SnapshotList, error) {
		sns, err := cl.Snapshots(cmd.Context(), sandbox)
		return api.SnapshotList{Snapshots: sns}, err
	}, func(l api.SnapshotList) error {
		return g.printTable([]string{"ID", "NAME", "SANDBOX", "STATE", "LOGICAL", "NEW", "CREATED"}, func(row func(...any)) {
			for _, sn := range l.Snapshots {
				row(sn.ID, sn.Name, sn.SandboxID, sn.State, mib(sn.LogicalBytes), mib(sn.NewBytes), g.ago(sn.CreatedAt))
			}
		})
	})
	c.Flags().StringVar(&sandbox, "sandbox", "", "only snapshots of this sandbox `ID`")
	return c
}

func mib(n int64) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

func newSnapshotGetCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:   "get SNAPSHOT",
		Short: "Describe a snapshot (by ID or name) or a checkpoint",
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Snapshot, error) {
		return cl.Snapshot(cmd.Context(), args[0])
	}, func(sn api.Snapshot) error {
		return g.printFields("id", sn.ID, "name", sn.Name, "sandbox", sn.SandboxID, "checkpoint", sn.Checkpoint, "state", sn.State,
			"worker", sn.Worker, "logical", mib(sn.LogicalBytes), "new", mib(sn.NewBytes),
			"paused", fmt.Sprintf("%d ms", sn.PausedMS), "created", g.ago(sn.CreatedAt))
	})
}

func newSnapshotRemoveCmd(g *globals) *cobra.Command {
	c := newEachCmd(g, "rm", "Delete snapshots by ID or name (sandboxes started from them keep running)", (*client.Client).DeleteSnapshot)
	c.Aliases = []string{"delete"}
	return c
}

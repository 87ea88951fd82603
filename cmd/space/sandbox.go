package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"space/api"
	"space/client"
)

func newSandboxCmd(g *globals) *cobra.Command {
	return newGroupCmd("sandbox", "Create, list and remove sandboxes",
		newSandboxCreateCmd(g), newSandboxListCmd(g), newSandboxGetCmd(g), newSandboxRemoveCmd(g),
		newSandboxStateCmd(g, "pause", "Pause sandboxes (vCPUs stop; memory stays)", (*client.Client).PauseSandbox),
		newSandboxStateCmd(g, "suspend", "Suspend sandboxes to storage (the VM stops; memory is freed)", (*client.Client).SuspendSandbox),
		newSandboxStateCmd(g, "resume", "Resume paused or suspended sandboxes", (*client.Client).ResumeSandbox),
		newSandboxTimeoutCmd(g), newSandboxRestoreCmd(g), newSandboxForkCmd(g),
		newSandboxCheckpointCmd(g), newSandboxCheckpointsCmd(g), newSandboxHistoryCmd(g), newSandboxNetworkCmd(g), newSandboxSecretsCmd(g), newSandboxEgressLogCmd(g), newSandboxExposeCmd(g), newSandboxStatsCmd(g))
}

func newSandboxCreateCmd(g *globals) *cobra.Command {
	var (
		req         api.CreateSandbox
		timeout     time.Duration
		env, labels []string
		output      string
		nf          networkFlags
		network     bool
		pf          policyFlags
		policy      string
	)
	c := &cobra.Command{
		Use:   "create [flags]",
		Short: "Create a sandbox and print its ID",
		Long: `Create a sandbox and print its ID.

Every sandbox has a network interface behind an egress gateway of its own
that lets through only what --allow-host and --allow-cidr name (without
them, nothing: DNS answers NXDOMAIN). Change that later with
"space sandbox network", and see what it decided with
"space sandbox egress-log".

Without --checkpoints or a --checkpoint-* flag the sandbox takes the
server's default checkpoint policy (none unless its operator set one);
--checkpoints off takes none whatever the default.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			var err error
			if req.Env, err = parseKV("env", env); err != nil {
				return err
			}
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if req.TimeoutSeconds, err = seconds("timeout", timeout); err != nil {
				return err
			}
			if network || nf.set() {
				n, err := nf.network()
				if err != nil {
					return err
				}
				req.Network = &n
			}
			if req.Checkpoints, err = createPolicy(cmd.Flags(), &pf, policy); err != nil {
				return err
			}
			if req.FromSnapshot != "" && req.FromCheckpoint != "" {
				return usagef("--from-snapshot and --from-checkpoint: give one of them")
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			sb, err := cl.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if output == "json" {
				return g.printJSON(sb)
			}
			_, err = fmt.Fprintln(g.stdout, sb.ID)
			return err
		},
	}
	f := c.Flags()
	f.StringVar(&req.Template, "template", "", "template to start from: \"name\" (its latest ready version) or \"name:version\"; default the server's default")
	f.IntVar(&req.VCPUs, "vcpus", 0, "virtual CPUs (1 to 8); default 1")
	f.Int64Var(&req.MemoryMiB, "memory", 0, "guest memory in `MiB` (128 to 16384); default 512")
	f.Int64Var(&req.DiskMiB, "disk", 0, "disk size in `MiB` (512 to 65536); default 4096")
	f.DurationVar(&timeout, "timeout", 0, "time to live, e.g. 30m (an idle time with --on-timeout suspend); default 1h")
	f.StringVar(&req.OnTimeout, "on-timeout", "", "what the timeout does: delete (default) or suspend")
	f.StringArrayVar(&env, "env", nil, "environment of every command, `KEY=VALUE` (repeatable)")
	f.StringArrayVar(&labels, "label", nil, "a label, `key=value` (repeatable)")
	f.StringVar(&req.FromSnapshot, "from-snapshot", "", "start as a copy of this `snapshot` (ID or name) instead of booting")
	f.StringVar(&req.FromCheckpoint, "from-checkpoint", "", "start as a copy of this `checkpoint` (its ID, from \"space sandbox history\"): a branch from that point")
	f.StringVar(&policy, "checkpoints", "", "the checkpoint `policy` in one flag, e.g. every=5m,after_exec,keep=20,keep_for=24h (also min_exec=D); off: none, whatever the server's default")
	pf.register(f, "checkpoint-")
	f.StringArrayVar(&req.Secrets, "secret", nil, "grant this secret of the team (`name`; repeatable): the sandbox sees a placeholder, its gateway adds the value for the secret's hosts (allowed as host:443 in the policy)")
	f.BoolVar(&req.ColdBoot, "cold-boot", false, "boot the VM rather than restore the template's warm snapshot")
	f.BoolVar(&network, "network", false, "a network allowing nothing (the default)")
	f.MarkHidden("network") // every sandbox has a network now; kept for scripts that pass it
	nf.register(f, "network-off", "give the sandbox a network that is off, DNS included, until \"space sandbox network\" turns it on")
	outputFlag(f, &output)
	return c
}

func newSandboxListCmd(g *globals) *cobra.Command {
	var (
		opts   client.ListOptions
		labels []string
		output string
	)
	c := &cobra.Command{
		Use:     "ls [flags]",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			var err error
			if opts.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			sbs, err := cl.Sandboxes(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if output == "json" {
				return g.printJSON(api.SandboxList{Sandboxes: nonNil(sbs)})
			}
			return g.printTable([]string{"ID", "STATE", "TEMPLATE", "VCPUS", "MEMORY", "CREATED", "EXPIRES", "LABELS"},
				func(row func(...any)) {
					for _, sb := range sbs {
						row(sb.ID, sb.State, sb.Template, sb.VCPUs, fmt.Sprintf("%dMiB", sb.MemoryMiB),
							g.ago(sb.CreatedAt), g.until(sb.ExpiresAt), joinKV(sb.Labels))
					}
				})
		},
	}
	f := c.Flags()
	f.StringVar(&opts.State, "state", "", "only sandboxes in this `state` (e.g. running, suspended)")
	f.StringArrayVar(&labels, "label", nil, "only sandboxes with this label, `key=value` (repeatable)")
	outputFlag(f, &output)
	return c
}

func newSandboxGetCmd(g *globals) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "get ID",
		Short: "Describe a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			sb, err := cl.Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return g.printJSON(sb)
			}
			return g.printSandbox(sb)
		},
	}
	outputFlag(c.Flags(), &output)
	return c
}

// printSandbox prints sb as fields, one a line.
func (g *globals) printSandbox(sb api.Sandbox) error {
	kv := []string{
		"id", sb.ID,
		"team", sb.Team,
		"state", sb.State,
	}
	if sb.Agent != "" {
		kv = append(kv, "agent", sb.Agent)
	}
	kv = append(kv,
		"template", sb.Template,
		"worker", sb.Worker,
		"vcpus", strconv.Itoa(sb.VCPUs),
		"memory", fmt.Sprintf("%d MiB", sb.MemoryMiB),
		"disk", fmt.Sprintf("%d MiB", sb.DiskMiB),
		"created", sb.CreatedAt.Local().Format(time.RFC3339),
		"updated", sb.UpdatedAt.Local().Format(time.RFC3339),
	)
	if sb.ExpiresAt != nil {
		kv = append(kv, "expires", sb.ExpiresAt.Local().Format(time.RFC3339))
	}
	kv = append(kv, "env", joinKV(sb.Env), "labels", joinKV(sb.Labels), "network", networkText(sb.Network),
		"secrets", strings.Join(sb.Secrets, ", "), "checkpoints", policyText(sb.Checkpoints))
	if vm := sb.VM; vm != nil {
		kv = append(kv, "vm", fmt.Sprintf("%s %s (%s), %s in %d ms", vm.VMM, vm.VMMVersion, vm.Accel, vm.StartedBy, vm.BootMS))
	}
	return g.printFields(kv...)
}

func newSandboxRemoveCmd(g *globals) *cobra.Command {
	c := newEachCmd(g, "rm", "Delete sandboxes", (*client.Client).DeleteSandbox)
	c.Aliases = []string{"delete"}
	return c
}

// newSandboxStateCmd returns a verb that applies op to each sandbox named.
func newSandboxStateCmd(g *globals, use, short string, op func(*client.Client, context.Context, string) (api.Sandbox, error)) *cobra.Command {
	return newEachCmd(g, use, short, func(cl *client.Client, ctx context.Context, id string) error {
		_, err := op(cl, ctx, id)
		return err
	})
}

// newEachCmd returns a verb `use ID...` that applies op to each ID named
// and reports every failure.
func newEachCmd(g *globals, use, short string, op func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:   use + " ID...",
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.client()
			if err != nil {
				return err
			}
			var errs []error
			for _, id := range args {
				if err := op(cl, cmd.Context(), id); err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w", use, id, err))
				}
			}
			return errors.Join(errs...)
		},
	}
}

// outputFlag registers -o/--output.
func outputFlag(f *pflag.FlagSet, p *string) {
	f.StringVarP(p, "output", "o", "", "output `format`: json (default: a table)")
}

// checkOutput checks the value of -o.
func checkOutput(format string) error {
	switch format {
	case "", "json", "table":
		return nil
	}
	return usagef("-o %q: the formats are json and table", format)
}

// printJSON prints v as indented JSON.
func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printTable prints a table with the header and the rows that rows
// passes to row.
func (g *globals) printTable(header []string, rows func(row func(...any))) error {
	tw := tabwriter.NewWriter(g.stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	rows(func(cells ...any) {
		for i, c := range cells {
			if i > 0 {
				io.WriteString(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		io.WriteString(tw, "\n")
	})
	return tw.Flush()
}

// nonNil returns s, or an empty slice for nil (JSON [] rather than null).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// parseKV parses repeated KEY=VALUE flag values; nil when there are none.
func parseKV(flag string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--%s %q: want KEY=VALUE", flag, kv)
		}
		m[k] = v
	}
	return m, nil
}

// joinKV shows a map as sorted k=v pairs.
func joinKV(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// seconds converts a duration flag to whole seconds, rounding up.
func seconds(flag string, d time.Duration) (int64, error) {
	if d < 0 {
		return 0, usagef("--%s %v: must not be negative", flag, d)
	}
	return int64((d + time.Second - 1) / time.Second), nil
}

// ago shows how long ago t was, e.g. "5m ago".
func (g *globals) ago(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return short(g.now().Sub(t)) + " ago"
}

// until shows how long until t, e.g. "in 55m"; "" for nil.
func (g *globals) until(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	d := t.Sub(g.now())
	if d < 0 {
		return "expired"
	}
	return "in " + short(d)
}

// short shows d in its largest unit, e.g. 3h.
func short(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	}
}

func newSandboxRestoreCmd(g *globals) *cobra.Command {
	var snapshot, checkpoint string
	c := &cobra.Command{
		Use:   "restore ID (--snapshot S | --checkpoint C)",
		Short: "Roll a sandbox back to a snapshot or a checkpoint, in place",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (snapshot == "") == (checkpoint == "") {
				return usagef("give --snapshot or --checkpoint, one of them")
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			if checkpoint != "" {
				_, err = cl.RestoreCheckpoint(cmd.Context(), args[0], checkpoint)
			} else {
				_, err = cl.RestoreSandbox(cmd.Context(), args[0], snapshot)
			}
			return err
		},
	}
	c.Flags().StringVar(&snapshot, "snapshot", "", "the `snapshot` (ID or name)")
	c.Flags().StringVar(&checkpoint, "checkpoint", "", "the `checkpoint` (its ID, from \"space sandbox history\")")
	return c
}

func newSandboxForkCmd(g *globals) *cobra.Command {
	var count int
	c := withOutput(g, &cobra.Command{
		Use:   "fork ID [--count N]",
		Short: "Make running copies of a live sandbox; prints their IDs",
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.SandboxList, error) {
		sbs, err := cl.ForkSandbox(cmd.Context(), args[0], count)
		return api.SandboxList{Sandboxes: sbs}, err
	}, func(l api.SandboxList) error {
		for _, sb := range l.Sandboxes {
			if _, err := fmt.Fprintln(g.stdout, sb.ID); err != nil {
				return err
			}
		}
		return nil
	})
	c.Flags().IntVar(&count, "count", 1, "how many copies (1 to 16)")
	return c
}

func newSandboxTimeoutCmd(g *globals) *cobra.Command {
	var d time.Duration
	return withOutput(g, &cobra.Command{
		Use:   "timeout ID DURATION",
		Short: "Set a sandbox's timeout, counted from now",
		Long: `Set a sandbox's timeout to DURATION from now (e.g. 30m; whole seconds,
at most 168h) and print the sandbox. A sandbox whose timeout deletes it
is deleted then, sooner or later than before; one created with
--on-timeout suspend takes DURATION as its new idle time (a suspended one
from its next resume).`,
		Args: cobra.ExactArgs(2),
		PreRunE: func(cmd *cobra.Command, args []string) (err error) {
			if d, err = time.ParseDuration(args[1]); err != nil || d < time.Second {
				return usagef("timeout %q: want a duration of at least 1s, e.g. 30m", args[1])
			}
			return nil
		},
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Sandbox, error) {
		return cl.SetTimeout(cmd.Context(), args[0], d)
	}, g.printSandbox)
}

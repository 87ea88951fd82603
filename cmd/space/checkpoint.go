package main

import (
	"cmp"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"space/api"
	"space/client"
	"space/internal/checkpoint"
)

// policyFlags are the flags that describe a checkpoint policy: sandbox
// create's --checkpoint-every and so on, sandbox checkpoints' --every.
type policyFlags struct {
	prefix                  string // of the flags' names
	every, minExec, keepFor time.Duration
	afterExec               bool
	keep                    int
}

// register adds the flags to f, their names starting with prefix.
func (pf *policyFlags) register(f *pflag.FlagSet, prefix string) {
	pf.prefix = prefix
	f.DurationVar(&pf.every, prefix+"every", 0, "take a checkpoint this long after the last one, e.g. 5m (1s to 168h; 0: none on a schedule)")
	f.BoolVar(&pf.afterExec, prefix+"after-exec", false, "take a checkpoint when an attached command that ran at least --"+prefix+"min-exec ends")
	f.DurationVar(&pf.minExec, prefix+"min-exec", 0, fmt.Sprintf("how long a command must have run for --%safter-exec (default %s)", prefix, checkpoint.DefaultMinExec))
	f.IntVar(&pf.keep, prefix+"keep", 0, fmt.Sprintf("keep the `N` newest checkpoints (1 to %d; default %d)", checkpoint.MaxKeep, checkpoint.DefaultKeep))
	f.DurationVar(&pf.keepFor, prefix+"keep-for", 0, "delete checkpoints older than this, e.g. 24h, but never the newest (0: no age limit)")
}

var policyFlagNames = []string{"every", "after-exec", "min-exec", "keep", "keep-for"}

// set reports whether any of the flags was given.
func (pf *policyFlags) set(f *pflag.FlagSet) bool {
	for _, name := range policyFlagNames {
		if f.Changed(pf.prefix + name) {
			return true
		}
	}
	return false
}

// apply returns p with the values of the flags that were given.
func (pf *policyFlags) apply(f *pflag.FlagSet, p api.CheckpointPolicy) (api.CheckpointPolicy, error) {
	changed := func(name string) bool { return f.Changed(pf.prefix + name) }
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"every", pf.every}, {"min-exec", pf.minExec}, {"keep-for", pf.keepFor}} {
		if d.v < 0 {
			return p, usagef("--%s%s %v: must not be negative", pf.prefix, d.name, d.v)
		}
	}
	if pf.keep < 0 {
		return p, usagef("--%skeep %d: must not be negative", pf.prefix, pf.keep)
	}
	if changed("every") {
		p.Every = durationOrNone(pf.every)
	}
	if changed("after-exec") {
		p.AfterExec = pf.afterExec
	}
	if changed("min-exec") {
		p.MinExec = pf.minExec.String() // 0s: every command, unlike "" (the default)
	}
	if changed("keep") {
		p.Keep = pf.keep
	}
	if changed("keep-for") {
		p.KeepFor = durationOrNone(pf.keepFor)
	}
	return p, nil
}

// durationOrNone is d as the API takes it, "" for 0.
func durationOrNone(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// checkPolicy checks p as the server will, so that a bad policy is a
// usage error before anything is sent; what names where p came from.
func checkPolicy(what string, p api.CheckpointPolicy) error {
	if _, err := checkpoint.FromAPI("checkpoints", p); err != nil {
		return usagef("%s: %v", what, err)
	}
	return nil
}

// createPolicy returns the checkpoint policy sandbox create's flags ask
// for: --checkpoints POLICY or the --checkpoint-* flags, nil (the
// server's default) when none is given.
func createPolicy(f *pflag.FlagSet, pf *policyFlags, policy string) (*api.CheckpointPolicy, error) {
	if !f.Changed("checkpoints") && !pf.set(f) {
		return nil, nil
	}
	if f.Changed("checkpoints") && pf.set(f) {
		return nil, usagef("--checkpoints and the --checkpoint-* flags: give the policy one way")
	}
	var (
		p   api.CheckpointPolicy
		err error
	)
	what := "checkpoint flags"
	if f.Changed("checkpoints") {
		what = fmt.Sprintf("--checkpoints %q", policy)
		if p, err = checkpoint.Parse(policy); err != nil {
			return nil, usagef("%s: %v", what, err)
		}
	} else if p, err = pf.apply(f, p); err != nil {
		return nil, err
	}
	if err := checkPolicy(what, p); err != nil {
		return nil, err
	}
	return &p, nil // the zero policy, sent as {}, takes none whatever the default
}

// policyText describes a checkpoint policy in a line, "" for none.
func policyText(p *api.CheckpointPolicy) string {
	if p == nil || (p.Every == "" && !p.AfterExec) {
		return ""
	}
	var parts []string
	if p.Every != "" {
		parts = append(parts, "every "+p.Every)
	}
	if p.AfterExec {
		parts = append(parts, "after commands of "+cmp.Or(p.MinExec, checkpoint.DefaultMinExec.String())+" or more")
	}
	keep := "keep " + strconv.Itoa(cmp.Or(p.Keep, checkpoint.DefaultKeep))
	if p.KeepFor != "" {
		keep += " up to " + p.KeepFor
	}
	return strings.Join(append(parts, keep), ", ")
}

func newSandboxCheckpointsCmd(g *globals) *cobra.Command {
	var (
		pf  policyFlags
		off bool
	)
	c := withOutput(g, &cobra.Command{
		Use:   "checkpoints ID [--every D] [--after-exec[=false]] [--min-exec D] [--keep N] [--keep-for D] [--off]",
		Short: "Show or change a sandbox's checkpoint policy",
		Long: `Without flags, print the checkpoint policy in force for a sandbox. With
flags, change it and print the new one: the flags given replace those
settings, the others keep their current values; --off takes no more
automatic checkpoints (the history stays). See "space sandbox history" for
the checkpoints taken.`,
		Args: cobra.ExactArgs(1),
		// A bad flag is a usage error (one of RunE's would not be).
		PreRunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if off && pf.set(f) {
				return usagef("--off and a policy flag: give one of them")
			}
			// The server checks each setting on its own: the flags'
			// values may be checked before the current policy is known.
			p, err := pf.apply(f, api.CheckpointPolicy{})
			if err != nil {
				return err
			}
			return checkPolicy("checkpoint policy", p)
		},
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.CheckpointPolicy, error) {
		f := cmd.Flags()
		if !off && !pf.set(f) {
			l, err := cl.Checkpoints(cmd.Context(), args[0])
			return l.Policy, err
		}
		var p api.CheckpointPolicy
		if !off {
			sb, err := cl.Sandbox(cmd.Context(), args[0])
			if err != nil {
				return p, err
			}
			if sb.Checkpoints != nil {
				p = *sb.Checkpoints
			}
			if p, err = pf.apply(f, p); err != nil {
				return p, err
			}
		}
		sb, err := cl.SetCheckpointPolicy(cmd.Context(), args[0], p)
		if err != nil || sb.Checkpoints == nil {
			return api.CheckpointPolicy{}, err
		}
		return *sb.Checkpoints, nil
	}, func(p api.CheckpointPolicy) error {
		_, err := fmt.Fprintln(g.stdout, cmp.Or(policyText(&p), "off"))
		return err
	})
	pf.register(c.Flags(), "")
	c.Flags().BoolVar(&off, "off", false, "take no more automatic checkpoints")
	return c
}

func newSandboxCheckpointCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:   "checkpoint ID",
		Short: "Take a checkpoint of a sandbox now; prints its ID",
		Long: `Take a live checkpoint of a running or paused sandbox now, whatever its
policy, and print its ID. It joins the sandbox's history ("space sandbox
history") and is pruned with the others by the policy's keep and keep-for.`,
		Args: cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.Checkpoint, error) {
		return cl.CreateCheckpoint(cmd.Context(), args[0])
	}, func(cp api.Checkpoint) error {
		_, err := fmt.Fprintln(g.stdout, cp.ID)
		return err
	})
}

func newSandboxHistoryCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:   "history ID",
		Short: "List a sandbox's checkpoints, newest first",
		Long: `List a sandbox's checkpoints, newest first: when each was taken, what
triggered it (schedule, exec or manual), what it added to storage, how long
the guest was paused, and the last command that ended before it. Roll the
sandbox back to one with "space sandbox restore ID --checkpoint C", or
start a branch from one with "space sandbox create --from-checkpoint C".`,
		Args: cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.CheckpointList, error) {
		l, err := cl.Checkpoints(cmd.Context(), args[0])
		l.Checkpoints = nonNil(l.Checkpoints)
		return l, err
	}, g.printHistory)
}

// historyCommandWidth is how much of a command the history shows when
// its output is not a terminal.
const historyCommandWidth = 60

// printHistory prints l's checkpoints as a table, each command cut so
// that its row fits the terminal.
func (g *globals) printHistory(l api.CheckpointList) error {
	header := []string{"ID", "CREATED", "TRIGGER", "STORED", "PAUSED", "COMMAND"}
	rows := make([][]string, 0, len(l.Checkpoints))
	for _, cp := range l.Checkpoints {
		rows = append(rows, []string{cp.ID, g.ago(cp.CreatedAt), cp.Trigger, bytesText(cp.StoredBytes),
			fmt.Sprintf("%dms", cp.PausedMS), strings.Join(strings.Fields(cp.Command), " ")})
	}
	width := historyCommandWidth
	if cols := g.terminalWidth(); cols > 0 {
		// The columns before COMMAND, each padded by 2 (printTable).
		used := 0
		for i := range len(header) - 1 {
			w := len(header[i])
			for _, r := range rows {
				w = max(w, utf8.RuneCountInString(r[i]))
			}
			used += w + 2
		}
		width = max(cols-used, 20)
	}
	return g.printTable(header, func(row func(...any)) {
		for _, r := range rows {
			r[5] = cut(r[5], width)
			row(r[0], r[1], r[2], r[3], r[4], r[5])
		}
	})
}

// terminalWidth returns the columns of the terminal stdout is, or 0.
func (g *globals) terminalWidth() int {
	f, ok := g.stdout.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0
	}
	cols, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return cols
}

// cut returns s cut to n characters, ending in "..." when it was longer.
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:max(n-3, 0)]) + "..."
}

// bytesText shows n bytes in binary units: 512B, 4.0KiB, 12.3MiB.
func bytesText(n int64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	v, i := float64(n)/1024, 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f%s", v, units[i])
}

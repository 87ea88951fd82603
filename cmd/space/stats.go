package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

// newSandboxStatsCmd is `space sandbox stats`: what sandboxes use now,
// refreshed like docker stats, from their usage histories.
func newSandboxStatsCmd(g *globals) *cobra.Command {
	var (
		noStream bool
		every    time.Duration
		output   string
	)
	c := &cobra.Command{
		Use:   "stats [ID...]",
		Short: "Show what sandboxes use (CPU, memory, disk, network), live",
		Long: `Show the latest usage sample of each sandbox named, or of every running
sandbox of the team, and refresh it until interrupted (--no-stream: once).
Workers sample running sandboxes every few seconds; the SAMPLED column says
how old each sample is. With -o json each refresh prints one JSON array.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if every < time.Second {
				return fmt.Errorf("--interval %s: want at least 1s", every)
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			clear := !noStream && output != "json" && isTerminal(g.stdout)
			for {
				rows, err := latestUsage(ctx, cl, args, g.now().Add(-2*time.Minute))
				if err != nil {
					return err
				}
				if clear {
					io.WriteString(g.stdout, "\x1b[H\x1b[2J")
				}
				if err := g.printStats(rows, output); err != nil {
					return err
				}
				if noStream {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(every):
				}
				if !clear && output != "json" {
					fmt.Fprintln(g.stdout)
				}
			}
		},
	}
	f := c.Flags()
	f.BoolVar(&noStream, "no-stream", false, "print once and exit")
	f.DurationVar(&every, "interval", 5*time.Second, "refresh every `duration`")
	outputFlag(f, &output)
	return c
}

// statsRow is one sandbox's latest sample; Sample is nil while it has
// none (just created, or not running).
type statsRow struct {
	ID     string           `json:"sandbox_id"`
	Sample *api.UsageSample `json:"sample"`
}

// latestUsage reads the newest sample of each sandbox in ids, or of
// every running sandbox when ids is empty.
func latestUsage(ctx context.Context, cl *client.Client, ids []string, since time.Time) ([]statsRow, error) {
	if len(ids) == 0 {
		sbs, err := cl.Sandboxes(ctx, client.ListOptions{State: "running"})
		if err != nil {
			return nil, err
		}
		for _, sb := range sbs {
			ids = append(ids, sb.ID)
		}
	}
	rows := make([]statsRow, 0, len(ids))
	for _, id := range ids {
		m, err := cl.Metrics(ctx, id, since, time.Time{})
		if err != nil {
			return nil, err
		}
		r := statsRow{ID: id}
		if n := len(m.Samples); n > 0 {
			r.Sample = &m.Samples[n-1]
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func (g *globals) printStats(rows []statsRow, output string) error {
	if output == "json" {
		return g.printJSON(rows)
	}
	pct := func(a, b int64) string {
		if b <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", float64(a)/float64(b)*100)
	}
	return g.printTable([]string{"ID", "CPU %", "CPUS", "MEM USED / TOTAL", "MEM %", "CACHE", "HOST (PSS)", "DISK USED / TOTAL", "NET RX / TX", "SAMPLED"},
		func(row func(...any)) {
			for _, r := range rows {
				s := r.Sample
				if s == nil {
					row(r.ID, "-", "-", "-", "-", "-", "-", "-", "-", "never")
					continue
				}
				row(r.ID, fmt.Sprintf("%.1f%%", s.CPUUsedPct), s.CPUs,
					bytesText(s.MemUsedBytes)+" / "+bytesText(s.MemTotalBytes), pct(s.MemUsedBytes, s.MemTotalBytes),
					bytesText(s.MemCacheBytes), bytesText(s.VMMPSSBytes),
					bytesText(s.DiskUsedBytes)+" / "+bytesText(s.DiskTotalBytes),
					bytesText(s.NetRxBytes)+" / "+bytesText(s.NetTxBytes), g.ago(s.Time))
			}
		})
}

// isTerminal reports whether w is a terminal (so a refresh may clear
// it).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"space/api"
	"space/client"
	"space/internal/audit"
)

func newAuditCmd(g *globals) *cobra.Command {
	return newGroupCmd("audit", "Read, export and verify the audit log (admin keys)",
		newAuditListCmd(g), newAuditExportCmd(g), newAuditVerifyCmd(g))
}

// auditFilter holds the flags that select entries.
type auditFilter struct {
	team, since, until string
}

func (f *auditFilter) flags(fs *pflag.FlagSet) {
	fs.StringVar(&f.team, "team", "", "only this `team`'s entries (default: every team's)")
	fs.StringVar(&f.since, "since", "", "only entries from this `time` on: RFC 3339, or a duration ago (1h)")
	fs.StringVar(&f.until, "until", "", "only entries before this `time`: RFC 3339, or a duration ago")
}

// query returns the flags as a query, times read relative to now.
func (f *auditFilter) query(now time.Time) (client.AuditQuery, error) {
	q := client.AuditQuery{Team: f.team}
	for _, t := range []struct {
		flag, v string
		p       *time.Time
	}{{"since", f.since, &q.Since}, {"until", f.until, &q.Until}} {
		if t.v == "" {
			continue
		}
		if d, err := time.ParseDuration(t.v); err == nil && d >= 0 {
			*t.p = now.Add(-d)
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, t.v)
		if err != nil {
			return q, usagef("--%s %q: want an RFC 3339 time (2026-12-07T19:00:00Z) or a duration (1h)", t.flag, t.v)
		}
		*t.p = at
	}
	return q, nil
}

func newAuditListCmd(g *globals) *cobra.Command {
	var (
		filter  auditFilter
		limit   int
		output  string
		asJSON  bool
		hashes  bool
		pageMax = 1000
	)
	c := &cobra.Command{
		Use:     "ls [--team T] [--since T] [--until T] [--limit N]",
		Aliases: []string{"list"},
		Short:   "List audit log entries, oldest first",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON {
				output = "json"
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			if limit < 1 {
				return usagef("--limit %d: want 1 or more", limit)
			}
			q, err := filter.query(g.now())
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			var entries []api.AuditEntry
			var anchor api.AuditAnchor
			for len(entries) < limit {
				q.Limit = min(limit-len(entries), pageMax)
				page, err := cl.Audit(cmd.Context(), q)
				if err != nil {
					return err
				}
				if entries == nil {
					anchor = page.Anchor
				}
				entries = append(entries, page.Entries...)
				if page.Next == 0 {
					break
				}
				q.After = page.Next
			}
			if output == "json" {
				return g.printJSON(api.AuditList{Entries: nonNil(entries), Anchor: anchor})
			}
			header := []string{"SEQ", "TIME", "TEAM", "KEY", "METHOD", "ROUTE", "TARGETS", "CODE", "OUTCOME", "SOURCE", "REQUEST"}
			if hashes {
				header = append(header, "HASH")
			}
			return g.printTable(header, func(row func(...any)) {
				for _, e := range entries {
					cells := []any{e.Seq, e.Time.Format(time.RFC3339), dash(e.TeamID), dash(e.KeyID), e.Method, e.Route,
						dash(auditTargets(e.Targets)), e.Code, e.Outcome, e.Source, e.RequestID}
					if hashes {
						cells = append(cells, e.Hash)
					}
					row(cells...)
				}
			})
		},
	}
	f := c.Flags()
	filter.flags(f)
	f.IntVar(&limit, "limit", 100, "show at most `n` entries")
	f.BoolVar(&asJSON, "json", false, "print JSON (as -o json)")
	f.BoolVar(&hashes, "hashes", false, "show each entry's hash")
	outputFlag(f, &output)
	return c
}

// auditTargets shows targets as "id=sbx_…,sid=snp_…", sorted.
func auditTargets(t map[string]string) string {
	var out []string
	for k, v := range t {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newAuditExportCmd(g *globals) *cobra.Command {
	var filter auditFilter
	c := &cobra.Command{
		Use:   "export [--team T] [--since T] [--until T] > audit.ndjson",
		Short: "Write the audit log as NDJSON (the anchor, then one entry a line)",
		Long: `Write every entry of the audit log the flags select to stdout, one JSON
object a line after a first line that holds the anchor (where the chain
starts). An export of the whole log (no flags) can be checked offline with
space audit verify --file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			q, err := filter.query(g.now())
			if err != nil {
				return err
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			body, err := cl.AuditExport(cmd.Context(), q)
			if err != nil {
				return err
			}
			defer body.Close()
			_, err = io.Copy(g.stdout, body)
			return err
		},
	}
	filter.flags(c.Flags())
	return c
}

func newAuditVerifyCmd(g *globals) *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "verify [--file audit.ndjson]",
		Short: "Check the audit log's hash chain here, on the whole log or an export",
		Long: `Fetch the whole audit log from the server (or read an export of it from
--file, - for stdin) and check its hash chain on this machine: every
entry's hash is recomputed from its fields, and each must follow the one
before it (or the anchor, the last entry pruned). The first entry that was
edited, deleted or moved is named, and the exit status is 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var r io.Reader
			switch file {
			case "":
				cl, err := g.client()
				if err != nil {
					return err
				}
				body, err := cl.AuditExport(cmd.Context(), client.AuditQuery{})
				if err != nil {
					return err
				}
				defer body.Close()
				r = body
			case "-":
				r = g.stdin
			default:
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			res, err := verifyExport(r)
			if err != nil {
				return err
			}
			if res.Entries == 0 {
				fmt.Fprintf(g.stdout, "audit log intact: 0 entries (after seq %d)\n", res.Anchor.Seq)
				return nil
			}
			fmt.Fprintf(g.stdout, "audit log intact: %d entries from seq %d to %d\n", res.Entries, res.First, res.Last)
			return nil
		},
	}
	c.Flags().StringVar(&file, "file", "", "read an export from `file` (- for stdin) instead of the server")
	return c
}

// verifyExport checks an NDJSON export: its anchor line, then its
// entries, one at a time.
func verifyExport(r io.Reader) (audit.Result, error) {
	dec := json.NewDecoder(bufio.NewReader(r))
	var head struct {
		Anchor *api.AuditAnchor `json:"anchor"` // as api.AuditExportHead, but required
	}
	if err := dec.Decode(&head); err != nil {
		return audit.Result{}, fmt.Errorf("read the export's first line (the anchor): %w", err)
	}
	if head.Anchor == nil {
		return audit.Result{}, errors.New(`the export's first line is not its anchor ({"anchor":{…}}): is it an export of the whole log?`)
	}
	anchor, err := audit.AnchorFromAPI(*head.Anchor)
	if err != nil {
		return audit.Result{}, err
	}
	v := audit.NewVerifier(anchor)
	for n := 1; ; n++ {
		var line struct {
			api.AuditEntry
			Error *api.ErrorBody `json:"error"` // the server could not finish the export
		}
		err := dec.Decode(&line)
		if errors.Is(err, io.EOF) {
			return v.Result()
		}
		if err != nil {
			return audit.Result{}, fmt.Errorf("read entry %d of the export: %w", n, err)
		}
		if line.Error != nil {
			return audit.Result{}, fmt.Errorf("the export was cut short after entry %d: %s", n-1, line.Error.Message)
		}
		se, err := audit.FromAPI(line.AuditEntry)
		if err != nil {
			return audit.Result{}, err
		}
		if err := v.Add(se); err != nil {
			return audit.Result{}, err
		}
	}
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"space/api"
	"space/client"
)

func newTemplateCmd(g *globals) *cobra.Command {
	return newGroupCmd("template", "Build, list and delete templates",
		newTemplateBuildCmd(g), newTemplateListCmd(g), newTemplateGetCmd(g), newTemplateRemoveCmd(g))
}

func newTemplateBuildCmd(g *globals) *cobra.Command {
	var name, output string
	c := &cobra.Command{
		Use:   "build FILE [--name N]",
		Short: "Build a template from a spec file",
		Long: `Build a template from the spec FILE (a directory means DIR/space.yaml; the
format is in docs/templates.md) and print the build's progress: a line per
step, the output of the steps that run, and a summary. The build context is
the spec file's directory, of which only the spec file, the copy sources and
a local base are sent. Steps whose inputs did not change come from the
build cache.

With -o json the build's events are printed as JSON lines, and then the new
template (or, when the build fails, the error event). A failed build exits
with status 125.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			file := args[0]
			if fi, err := os.Stat(file); err == nil && fi.IsDir() {
				file = filepath.Join(file, "space.yaml")
			}
			cl, err := g.client()
			if err != nil {
				return err
			}
			rc, opts, err := client.PackContext(file)
			if err != nil {
				return err
			}
			defer rc.Close()
			opts.Name = name
			p := &buildProgress{g: g, json: output == "json", steps: map[int]string{}}
			t, rep, err := cl.BuildTemplate(cmd.Context(), rc, opts, p.event)
			if err != nil {
				return p.failed(rep, err)
			}
			return p.done(t, rep)
		},
	}
	c.Flags().StringVar(&name, "name", "", "the template's `name` (default: the spec's name field)")
	outputFlag(c.Flags(), &output)
	return c
}

// buildProgress prints a build's events as they come.
type buildProgress struct {
	g     *globals
	json  bool           // print the events as JSON lines
	steps map[int]string // what each step started does, by number
	// midLine is set while the steps' output on stdout ends without a
	// newline.
	midLine bool
	err     error // the first failed write, or nil
}

func (p *buildProgress) event(ev api.BuildEvent) {
	if p.json {
		p.writeJSONLine(ev)
		return
	}
	switch ev.Type {
	case "step":
		p.steps[ev.Step] = ev.Text
		p.line("[%d/%d] %s", ev.Step, ev.Steps, ev.Text)
	case "cached":
		p.line("[%d/%d] cached %s", ev.Step, ev.Steps, ev.Text)
	case "phase":
		p.line("=> %s", ev.Text)
	case "output":
		w := p.g.stdout
		if ev.Stream == "stderr" {
			w = p.g.stderr
		} else if len(ev.Data) > 0 {
			p.midLine = ev.Data[len(ev.Data)-1] != '\n'
		}
		p.write(w.Write(ev.Data))
	}
}

// line prints a progress line on stdout, on a line of its own.
func (p *buildProgress) line(format string, args ...any) {
	if p.midLine {
		p.write(io.WriteString(p.g.stdout, "\n"))
		p.midLine = false
	}
	p.write(fmt.Fprintf(p.g.stdout, format+"\n", args...))
}

func (p *buildProgress) writeJSONLine(v any) {
	b, err := json.Marshal(v)
	if err == nil {
		_, err = p.g.stdout.Write(append(b, '\n'))
	}
	p.write(0, err)
}

func (p *buildProgress) write(_ int, err error) {
	if p.err == nil && err != nil {
		p.err = fmt.Errorf("print build progress: %w", err)
	}
}

// done prints the built template (a summary, or its JSON).
func (p *buildProgress) done(t api.Template, rep api.BuildReport) error {
	if p.json {
		p.writeJSONLine(t)
	} else {
		p.line("built %s:%d in %s", t.Name, t.Version, buildSummary(rep))
	}
	return p.err
}

// failed prints what failed in a build and returns err.
func (p *buildProgress) failed(rep api.BuildReport, err error) error {
	if p.json {
		var e *client.Error
		if errors.As(err, &e) {
			p.writeJSONLine(api.BuildEvent{Type: "error", Error: &api.ErrorBody{Code: e.Code, Message: e.Message, Field: e.Field},
				Report: &rep})
		}
		return fmt.Errorf("build template: %w", err)
	}
	if p.midLine {
		p.write(io.WriteString(p.g.stdout, "\n"))
	}
	if rep.FailedStep > 0 {
		msg := fmt.Sprintf("failed step [%d/%d] %s", rep.FailedStep, rep.Steps, p.steps[rep.FailedStep])
		if rep.ExitCode != nil {
			msg += ": exit code " + strconv.Itoa(*rep.ExitCode)
		}
		p.write(fmt.Fprintln(p.g.stderr, msg))
	}
	return fmt.Errorf("build template: %w", err)
}

// buildSummary says how long a build took and what it ran, e.g. "1.5s: 1
// step run, 2 cached; VM restored from the cache".
func buildSummary(rep api.BuildReport) string {
	run := fmt.Sprintf("%d steps run", rep.Executed)
	if rep.Executed == 1 {
		run = "1 step run"
	}
	vm := "no VM started"
	switch rep.VMStarted {
	case "boot":
		vm = "VM booted from the base image"
	case "restore":
		vm = "VM restored from the cache"
	}
	d := (time.Duration(rep.DurationMS) * time.Millisecond).Round(100 * time.Millisecond)
	return fmt.Sprintf("%s: %s, %d cached; %s", d, run, rep.Cached, vm)
}

func newTemplateListCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the server's templates and every version of your team's",
		Args:    cobra.NoArgs,
	}, func(cmd *cobra.Command, cl *client.Client, _ []string) (api.TemplateList, error) {
		ts, err := cl.Templates(cmd.Context())
		return api.TemplateList{Templates: nonNil(ts)}, err
	}, func(l api.TemplateList) error {
		return g.printTemplates(l.Templates)
	})
}

func (g *globals) printTemplates(ts []api.Template) error {
	return g.printTable([]string{"NAME", "VERSION", "STATE", "DEFAULT", "VCPUS", "MEMORY", "CREATED"}, func(row func(...any)) {
		for _, t := range ts {
			row(t.Name, templateVersion(t), t.State, yes(t.Default), t.VCPUs, fmt.Sprintf("%dMiB", t.MemoryMiB), g.ago(t.CreatedAt))
		}
	})
}

// templateVersion is a template's version, or "" for a built-in one.
func templateVersion(t api.Template) string {
	if t.Version == 0 {
		return ""
	}
	return strconv.Itoa(t.Version)
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return ""
}

func newTemplateGetCmd(g *globals) *cobra.Command {
	return withOutput(g, &cobra.Command{
		Use:   "get REF",
		Short: `Describe a template: "name" (all its versions) or "name:version"`,
		Args:  cobra.ExactArgs(1),
	}, func(cmd *cobra.Command, cl *client.Client, args []string) (api.TemplateList, error) {
		ts, err := cl.Template(cmd.Context(), args[0])
		return api.TemplateList{Templates: nonNil(ts)}, err
	}, func(l api.TemplateList) error {
		if len(l.Templates) != 1 {
			return g.printTemplates(l.Templates)
		}
		t := l.Templates[0]
		var build string
		if t.Report != nil {
			build = buildSummary(*t.Report)
		}
		nonZero := func(n int64, unit string) string {
			if n == 0 {
				return ""
			}
			return strconv.FormatInt(n, 10) + unit
		}
		return g.printFields("name", t.Name, "version", templateVersion(t), "state", t.State, "default", yes(t.Default),
			"image", t.Image, "snapshot", t.Snapshot, "vcpus", nonZero(int64(t.VCPUs), ""),
			"memory", nonZero(t.MemoryMiB, " MiB"), "disk", nonZero(t.DiskMiB, " MiB"), "env", joinKV(t.Env),
			"workdir", t.Workdir, "user", t.User, "start", strings.Join(t.Start, " "), "build", build,
			"error", t.Error, "created", g.ago(t.CreatedAt))
	})
}

func newTemplateRemoveCmd(g *globals) *cobra.Command {
	c := newEachCmd(g, "rm", `Delete templates: "name:version", or every version of "name"`, (*client.Client).DeleteTemplate)
	c.Use = "rm REF..."
	c.Aliases = []string{"delete"}
	return c
}

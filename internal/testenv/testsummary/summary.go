package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
)

// gatePrefix starts every skip message written by testenv.Unavailable.
const gatePrefix = `test tier "`

// event is one line of `go test -json`: a test event (test2json's TestEvent)
// or a build event (ImportPath set; Action "build-output" or "build-fail").
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string
	FailedBuild string
}

// Package results in pkgResult.Result.
const (
	resultOK       = "ok"
	resultFail     = "FAIL"
	resultNoTests  = "no test files"
	resultNoResult = "no result"
)

// pkgResult counts one package's tests (subtests included).
type pkgResult struct {
	Package string
	Result  string // one of the result constants
	Passed  int
	Failed  int
	Skipped int
}

// skipped is one skipped test.
type skipped struct {
	Package string
	Test    string
	Tier    string // or "" when the message lacks the gate's prefix
	Reason  string // the skip message without the gate's wording
}

// report is what a whole run amounts to.
type report struct {
	Packages []pkgResult // in order of their first event
	Skips    []skipped   // in order of their events
	Problems []string    // reasons the run is not green; empty when it is
}

type checker struct {
	w        io.Writer
	required func(tier string) bool

	pkgs     map[string]*pkg
	order    []*pkg
	builds   map[string]*build // by ImportPath
	bOrder   []string
	skips    []skipped
	problems []string
}

type pkg struct {
	name   string
	tests  map[string]*test
	tOrder []*test
	out    strings.Builder // output outside any test
	result string          // "" until the package's final event
	passed int
	failed []string // names of failed tests, in order
	skips  int
}

type test struct {
	name string
	out  strings.Builder
	done bool
}

type build struct {
	out     strings.Builder
	failed  bool
	claimed bool // a package's fail event named it in FailedBuild
}

// check reads go test -json output from r, writes the readable log to w as
// events arrive, and returns the run's report. Lines that are not JSON
// events (stderr of the go command, say) are copied to w. Only a read error
// is returned as an error.
func check(r io.Reader, w io.Writer, required func(tier string) bool) (*report, error) {
	c := &checker{
		w:        w,
		required: required,
		pkgs:     make(map[string]*pkg),
		builds:   make(map[string]*build),
	}
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			c.line(line)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return c.finish(), nil
}

func (c *checker) line(line string) {
	var ev event
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &ev) != nil || ev.Action == "" {
		if !strings.HasSuffix(line, "\n") {
			line += "\n"
		}
		io.WriteString(c.w, line)
		return
	}
	switch ev.Action {
	case "build-output":
		c.build(ev.ImportPath).out.WriteString(ev.Output)
	case "build-fail":
		b := c.build(ev.ImportPath)
		b.failed = true
		io.WriteString(c.w, b.out.String())
	default:
		if ev.Package == "" {
			return
		}
		p := c.pkg(ev.Package)
		if ev.Test == "" {
			c.pkgEvent(p, ev)
		} else {
			c.testEvent(p, ev)
		}
	}
}

func (c *checker) build(importPath string) *build {
	b, ok := c.builds[importPath]
	if !ok {
		b = &build{}
		c.builds[importPath] = b
		c.bOrder = append(c.bOrder, importPath)
	}
	return b
}

func (c *checker) pkg(name string) *pkg {
	p, ok := c.pkgs[name]
	if !ok {
		p = &pkg{name: name, tests: make(map[string]*test)}
		c.pkgs[name] = p
		c.order = append(c.order, p)
	}
	return p
}

func (c *checker) testEvent(p *pkg, ev event) {
	t, ok := p.tests[ev.Test]
	if !ok {
		t = &test{name: ev.Test}
		p.tests[ev.Test] = t
		p.tOrder = append(p.tOrder, t)
	}
	switch ev.Action {
	case "output":
		t.out.WriteString(ev.Output)
	case "pass":
		t.done = true
		p.passed++
		t.out.Reset()
	case "fail":
		t.done = true
		fmt.Fprintf(c.w, "=== FAIL  %s  %s\n%s", p.name, t.name, t.out.String())
		// A parent fails with its subtests; name only the subtest.
		if !slices.ContainsFunc(p.failed, func(f string) bool { return strings.HasPrefix(f, t.name+"/") }) {
			c.problem("%s %s: failed", p.name, t.name)
		}
		p.failed = append(p.failed, t.name)
		t.out.Reset()
	case "skip":
		t.done = true
		p.skips++
		c.skip(p, t)
		t.out.Reset()
	}
}

func (c *checker) skip(p *pkg, t *test) {
	msg := skipMessage(t.out.String())
	fmt.Fprintf(c.w, "SKIP  %s  %s: %s\n", p.name, t.name, oneLine(msg))
	s := skipped{Package: p.name, Test: t.name, Reason: msg}
	tier, reason, ok := parseGate(msg)
	switch {
	case !ok:
		c.problem("%s %s: skipped without a tier gate (call a testenv gate instead of t.Skip): %q", p.name, t.name, oneLine(msg))
	case c.required(tier):
		c.problem("%s %s: required tier %q skipped: %s", p.name, t.name, tier, oneLine(reason))
	}
	if ok {
		s.Tier, s.Reason = tier, reason
	}
	c.skips = append(c.skips, s)
}

func (c *checker) pkgEvent(p *pkg, ev event) {
	switch ev.Action {
	case "output":
		p.out.WriteString(ev.Output)
	case "pass":
		p.result = resultOK
		c.printLines(p, "ok  \t", "ok  \t"+p.name+"\n")
	case "skip":
		p.result = resultNoTests
		c.printLines(p, "?   \t", "?   \t"+p.name+"\t[no test files]\n")
	case "fail":
		p.result = resultFail
		c.printUnfinished(p)
		io.WriteString(c.w, p.out.String())
		switch {
		case ev.FailedBuild != "":
			c.build(ev.FailedBuild).claimed = true
			c.problem("%s: build failed (%s)", p.name, ev.FailedBuild)
		case len(p.failed) == 0:
			c.problem("%s: FAIL without a failing test (see its output above)", p.name)
		}
	}
}

// printLines prints the lines of p's own output that start with prefix, or
// def if there are none.
func (c *checker) printLines(p *pkg, prefix, def string) {
	found := false
	for l := range strings.Lines(p.out.String()) {
		if strings.HasPrefix(l, prefix) {
			io.WriteString(c.w, l)
			found = true
		}
	}
	if !found {
		io.WriteString(c.w, def)
	}
}

// printUnfinished reports the tests of p that started but never ended: the
// ones running when the test binary panicked, timed out or exited.
func (c *checker) printUnfinished(p *pkg) {
	for _, t := range p.tOrder {
		if t.done {
			continue
		}
		t.done = true
		fmt.Fprintf(c.w, "=== FAIL  %s  %s (no result)\n%s", p.name, t.name, t.out.String())
		c.problem("%s %s: no result (panic, timeout or exit while it ran)", p.name, t.name)
		p.failed = append(p.failed, t.name)
	}
}

func (c *checker) problem(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *checker) finish() *report {
	rep := &report{Skips: c.skips}
	for _, p := range c.order {
		if p.result == "" {
			p.result = resultNoResult
			c.printUnfinished(p)
			io.WriteString(c.w, p.out.String())
			c.problem("%s: no final result (go test was killed or its output cut short)", p.name)
		}
		rep.Packages = append(rep.Packages, pkgResult{
			Package: p.name,
			Result:  p.result,
			Passed:  p.passed,
			Failed:  len(p.failed),
			Skipped: p.skips,
		})
	}
	for _, ip := range c.bOrder {
		if b := c.builds[ip]; b.failed && !b.claimed {
			c.problem("build of %s failed", ip)
		}
	}
	if len(c.order) == 0 {
		c.problem("no test events read (is the input the output of go test -json?)")
	}
	rep.Problems = c.problems
	return rep
}

// logEntry matches the start of a t.Log/t.Skip line: indentation, then
// "file.go:line: ".
var logEntry = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// skipMessage returns the last logged message in a skipped test's output,
// which is its skip message; continuation lines are joined with "\n".
func skipMessage(out string) string {
	var msg []string
	for l := range strings.Lines(out) {
		l = strings.TrimRight(l, "\n")
		trimmed := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "=== "), strings.HasPrefix(trimmed, "--- SKIP: "):
		case logEntry.MatchString(l):
			msg = []string{l[len(logEntry.FindString(l)):]}
		case msg != nil && trimmed != "":
			msg = append(msg, trimmed)
		}
	}
	return strings.Join(msg, "\n")
}

// parseGate splits a message of testenv.Unavailable into its tier and
// reason; ok is false when msg does not come from the gate.
func parseGate(msg string) (tier, reason string, ok bool) {
	rest, ok := strings.CutPrefix(msg, gatePrefix)
	if !ok {
		return "", "", false
	}
	tier, rest, ok = strings.Cut(rest, `"`)
	if !ok || tier == "" {
		return "", "", false
	}
	reason = strings.TrimPrefix(rest, " unavailable: ")
	reason = strings.TrimSuffix(reason, " (set SPACE_TEST_TIERS="+tier+" to require it)")
	return tier, reason, true
}

// tierOrder sorts skips by tier, those without one last.
func tierOrder(tier string) string {
	if tier == "" {
		return "\uffff"
	}
	return tier
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

// print writes the summary: test counts per package, skipped tests by tier,
// and the verdict.
func (r *report) print(w io.Writer) {
	fmt.Fprintln(w, "\n=== SUMMARY")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "package\tpassed\tfailed\tskipped\tresult")
	var total pkgResult
	noTests := 0
	for _, p := range r.Packages {
		if p.Result == resultNoTests {
			noTests++
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", p.Package, p.Passed, p.Failed, p.Skipped, p.Result)
		total.Passed += p.Passed
		total.Failed += p.Failed
		total.Skipped += p.Skipped
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\t\n", total.Passed, total.Failed, total.Skipped)
	tw.Flush()
	if noTests > 0 {
		fmt.Fprintf(w, "(%d packages without test files)\n", noTests)
	}

	if len(r.Skips) > 0 {
		fmt.Fprintln(w, "\n=== SKIPPED BY TIER")
		skips := slices.Clone(r.Skips)
		slices.SortStableFunc(skips, func(a, b skipped) int {
			return cmp.Compare(tierOrder(a.Tier), tierOrder(b.Tier))
		})
		tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		for i, s := range skips {
			if i == 0 || s.Tier != skips[i-1].Tier {
				n := 0
				for _, o := range skips {
					if o.Tier == s.Tier {
						n++
					}
				}
				name := "tier " + s.Tier
				if s.Tier == "" {
					name = "no tier (not skipped by a testenv gate)"
				}
				fmt.Fprintf(tw, "%s: %d skipped\n", name, n)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Package, s.Test, oneLine(s.Reason))
		}
		tw.Flush()
	}

	fmt.Fprintln(w)
	if len(r.Problems) == 0 {
		fmt.Fprintf(w, "PASS: %d passed, %d skipped\n", total.Passed, total.Skipped)
		return
	}
	noun := "problems"
	if len(r.Problems) == 1 {
		noun = "problem"
	}
	fmt.Fprintf(w, "FAIL: %d %s\n", len(r.Problems), noun)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "  %s\n", p)
	}
}

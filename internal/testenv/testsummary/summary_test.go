package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The streams in testdata were recorded with `go test -json` from a small
// scratch module; see testdata/README.md.

func requireOnly(tiers ...string) func(string) bool {
	return func(t string) bool { return slices.Contains(tiers, t) }
}

const (
	pkgPass     = "example.com/rec/pass"
	pkgSkipGate = "example.com/rec/skipgate"
	pkgSkipBad  = "example.com/rec/skipbad"
	pkgFail     = "example.com/rec/fail"
	pkgPanic    = "example.com/rec/panicking"
	pkgTimeout  = "example.com/rec/timeout"
	pkgBuildErr = "example.com/rec/builderr"
)

var (
	gateSkips = []skipped{
		{Package: pkgSkipGate, Test: "TestBoot", Tier: "qemu", Reason: "qemu-system-x86_64: not found (apt package qemu-system-x86)"},
		{Package: pkgSkipGate, Test: "TestLogThenSkip", Tier: "netns", Reason: "needs root"},
		{Package: pkgSkipGate, Test: "TestSub/slow", Tier: "slow", Reason: "slow tests run in CI or with SPACE_TEST_TIERS=slow"},
	}
	badSkips = []skipped{
		{Package: pkgSkipBad, Test: "TestNoDocker", Reason: "docker not available"},
		{Package: pkgSkipBad, Test: "TestSkipNow"},
	}
	badSkipProblems = []string{
		pkgSkipBad + ` TestNoDocker: skipped without a tier gate (call a testenv gate instead of t.Skip): "docker not available"`,
		pkgSkipBad + ` TestSkipNow: skipped without a tier gate (call a testenv gate instead of t.Skip): ""`,
	}
	failProblems = []string{
		pkgFail + " TestBad: failed",
		pkgFail + " TestSubFail/bad: failed",
		pkgFail + " TestRequired: failed",
	}
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name     string
		input    string // testdata file names, concatenated
		required func(string) bool
		want     report
		wantLog  []string // substrings of the log
		notInLog []string
	}{
		{
			name:     "pass",
			input:    "pass.jsonl",
			required: requireOnly("unit", "qemu"),
			want: report{
				Packages: []pkgResult{{Package: pkgPass, Result: "ok", Passed: 7}},
			},
			wantLog:  []string{"ok  \t" + pkgPass + "\t", "PASS: 7 passed, 0 skipped"},
			notInLog: []string{"chatty log line", "=== RUN", "--- PASS"},
		},
		{
			name:     "non-JSON lines pass through",
			input:    "noise.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: pkgPass, Result: "ok", Passed: 7}},
			},
			wantLog: []string{"go: downloading github.com/google/go-cmp v0.7.0\n", "some stray line\n"},
		},
		{
			name:     "gated skips of tiers not required",
			input:    "skipgate.jsonl",
			required: requireOnly("unit", "postgres"),
			want: report{
				Packages: []pkgResult{{Package: pkgSkipGate, Result: "ok", Passed: 3, Skipped: 3}},
				Skips:    gateSkips,
			},
			wantLog: []string{
				`SKIP  ` + pkgSkipGate + `  TestLogThenSkip: test tier "netns" unavailable: needs root`,
				"tier qemu: 1 skipped\n",
			},
			notInLog: []string{"probing network namespaces"},
		},
		{
			name:     "skip of a required tier",
			input:    "skipgate.jsonl",
			required: requireOnly("unit", "qemu", "slow"),
			want: report{
				Packages: []pkgResult{{Package: pkgSkipGate, Result: "ok", Passed: 3, Skipped: 3}},
				Skips:    gateSkips,
				Problems: []string{
					pkgSkipGate + ` TestBoot: required tier "qemu" skipped: qemu-system-x86_64: not found (apt package qemu-system-x86)`,
					pkgSkipGate + ` TestSub/slow: required tier "slow" skipped: slow tests run in CI or with SPACE_TEST_TIERS=slow`,
				},
			},
		},
		{
			name:     "skips without the gate",
			input:    "skipbad.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: pkgSkipBad, Result: "ok", Passed: 1, Skipped: 2}},
				Skips:    badSkips,
				Problems: badSkipProblems,
			},
			wantLog: []string{"no tier (not skipped by a testenv gate): 2 skipped"},
		},
		{
			name:     "failing tests",
			input:    "fail.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: pkgFail, Result: "FAIL", Passed: 2, Failed: 4}},
				Problems: failProblems,
			},
			wantLog: []string{
				"=== FAIL  " + pkgFail + "  TestBad\n=== RUN   TestBad\n    fail_test.go:12: context before failing\n",
				"        second line of message\n--- FAIL: TestBad",
				"    fail_test.go:18: boom\n",
				"FAIL\t" + pkgFail + "\t",
			},
			notInLog: []string{"=== RUN   TestOK"},
		},
		{
			name:     "panic",
			input:    "panic.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: pkgPanic, Result: "FAIL", Passed: 1, Failed: 1}},
				Problems: []string{pkgPanic + " TestPanic: failed"},
			},
			wantLog: []string{"panic: assignment to entry in nil map", "FAIL\t" + pkgPanic + "\t"},
		},
		{
			name:     "timeout",
			input:    "timeout.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: pkgTimeout, Result: "FAIL", Passed: 1, Failed: 1}},
				Problems: []string{pkgTimeout + " TestHang: no result (panic, timeout or exit while it ran)"},
			},
			wantLog: []string{
				"=== FAIL  " + pkgTimeout + "  TestHang (no result)\n",
				"    timeout_test.go:11: waiting forever\npanic: test timed out after 3s\n",
			},
		},
		{
			name:     "build failure",
			input:    "builderr.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: pkgBuildErr, Result: "FAIL"}},
				Problems: []string{pkgBuildErr + ": build failed (" + pkgBuildErr + " [" + pkgBuildErr + ".test])"},
			},
			wantLog: []string{"builderr/b_test.go:5:28: undefined: undefinedThing\n", "[build failed]"},
		},
		{
			name:     "setup failure",
			input:    "setupfail.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: "./nonexistent", Result: "FAIL"}},
				Problems: []string{"./nonexistent: build failed (./nonexistent)"},
			},
			wantLog: []string{"directory not found\n"},
		},
		{
			name:     "no test files",
			input:    "notests.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: "example.com/rec/notests", Result: "no test files"}},
			},
			wantLog: []string{"?   \texample.com/rec/notests\t[no test files]\n", "(1 packages without test files)"},
		},
		{
			name:     "truncated stream",
			input:    "truncated.jsonl",
			required: requireOnly(),
			want: report{
				Packages: []pkgResult{{Package: pkgSkipGate, Result: "no result", Passed: 3, Skipped: 3}},
				Skips:    gateSkips,
				Problems: []string{pkgSkipGate + ": no final result (go test was killed or its output cut short)"},
			},
		},
		{
			name:     "empty input",
			input:    "",
			required: requireOnly(),
			want: report{
				Problems: []string{"no test events read (is the input the output of go test -json?)"},
			},
		},
		{
			name:     "packages interleaved with -p 2",
			input:    "all.jsonl",
			required: requireOnly("unit", "netns"),
			want: report{
				Packages: []pkgResult{
					{Package: pkgBuildErr, Result: "FAIL"},
					{Package: pkgFail, Result: "FAIL", Passed: 2, Failed: 4},
					{Package: "example.com/rec/gate", Result: "no test files"},
					{Package: "example.com/rec/notests", Result: "no test files"},
					{Package: pkgPanic, Result: "FAIL", Passed: 1, Failed: 1},
					{Package: pkgPass, Result: "ok", Passed: 7},
					{Package: pkgSkipBad, Result: "ok", Passed: 1, Skipped: 2},
					{Package: pkgSkipGate, Result: "ok", Passed: 3, Skipped: 3},
					{Package: pkgTimeout, Result: "FAIL", Passed: 1, Failed: 1},
				},
				Skips: slices.Concat(badSkips, gateSkips),
				Problems: slices.Concat(
					[]string{pkgBuildErr + ": build failed (" + pkgBuildErr + " [" + pkgBuildErr + ".test])"},
					failProblems,
					[]string{pkgPanic + " TestPanic: failed"},
					badSkipProblems,
					[]string{
						pkgSkipGate + ` TestLogThenSkip: required tier "netns" skipped: needs root`,
						pkgTimeout + " TestHang: no result (panic, timeout or exit while it ran)",
					},
				),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in strings.Builder
			if tt.input != "" {
				b, err := os.ReadFile(filepath.Join("testdata", tt.input))
				if err != nil {
					t.Fatalf("setup: %v", err)
				}
				in.Write(b)
			}
			var log strings.Builder
			got, err := check(strings.NewReader(in.String()), &log, tt.required)
			if err != nil {
				t.Fatalf("check(%s) error: %v", tt.input, err)
			}
			if diff := cmp.Diff(&tt.want, got); diff != "" {
				t.Errorf("check(%s) report mismatch (-want +got):\n%s", tt.input, diff)
			}
			got.print(&log)
			for _, s := range tt.wantLog {
				if !strings.Contains(log.String(), s) {
					t.Errorf("check(%s) log lacks %q; log:\n%s", tt.input, s, log.String())
				}
			}
			for _, s := range tt.notInLog {
				if strings.Contains(log.String(), s) {
					t.Errorf("check(%s) log contains %q; log:\n%s", tt.input, s, log.String())
				}
			}
			verdict := "PASS: "
			if len(tt.want.Problems) > 0 {
				verdict = "FAIL: "
			}
			if !strings.Contains(log.String(), "\n"+verdict) {
				t.Errorf("check(%s) log lacks the verdict %q; log:\n%s", tt.input, verdict, log.String())
			}
		})
	}
}

func TestSkipMessage(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want string
	}{
		{
			name: "gate",
			out:  "=== RUN   TestBoot\n    boot_test.go:10: test tier \"qemu\" unavailable: x\n--- SKIP: TestBoot (0.00s)\n",
			want: `test tier "qemu" unavailable: x`,
		},
		{
			name: "last log entry wins",
			out:  "=== RUN   TestX\n    x_test.go:3: first\n    x_test.go:4: second\n--- SKIP: TestX (0.00s)\n",
			want: "second",
		},
		{
			name: "continuation lines",
			out:  "=== RUN   TestX\n    x_test.go:3: line one\n        line two\n--- SKIP: TestX (0.00s)\n",
			want: "line one\nline two",
		},
		{
			name: "nested subtest, message after the SKIP line",
			out:  "=== RUN   TestX/a\n        --- SKIP: TestX/a (0.00s)\n        x_test.go:9: later\n",
			want: "later",
		},
		{
			name: "no message",
			out:  "=== RUN   TestX\n--- SKIP: TestX (0.00s)\n",
			want: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := skipMessage(tt.out); got != tt.want {
				t.Errorf("skipMessage(%q) = %q, want %q", tt.out, got, tt.want)
			}
		})
	}
}

func TestParseGate(t *testing.T) {
	tests := []struct {
		msg       string
		tier, why string
		ok        bool
	}{
		{`test tier "qemu" unavailable: no qemu (set SPACE_TEST_TIERS=qemu to require it)`, "qemu", "no qemu", true},
		{`test tier "slow" unavailable: -short given`, "slow", "-short given", true},
		{`test tier "" unavailable: x`, "", "", false},
		{`test tier "qemu`, "", "", false},
		{`needs docker`, "", "", false},
		{``, "", "", false},
	}
	for _, tt := range tests {
		tier, why, ok := parseGate(tt.msg)
		if tier != tt.tier || why != tt.why || ok != tt.ok {
			t.Errorf("parseGate(%q) = %q, %q, %v, want %q, %q, %v", tt.msg, tier, why, ok, tt.tier, tt.why, tt.ok)
		}
	}
}

func TestRequiredTiers(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string // "" value: unset
		tier string
		want bool
	}{
		{"listed", map[string]string{"SPACE_TEST_TIERS": "unit, qemu", "CI": "true"}, "qemu", true},
		{"not listed", map[string]string{"SPACE_TEST_TIERS": "unit,qemu", "CI": "true"}, "k8s", false},
		{"unset in CI", map[string]string{"SPACE_TEST_TIERS": "", "CI": "true"}, "k8s", true},
		{"unset locally", map[string]string{"SPACE_TEST_TIERS": "", "CI": ""}, "qemu", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v) // restores the old value after the test
				if v == "" {
					os.Unsetenv(k)
				}
			}
			if got := requiredTiers()(tt.tier); got != tt.want {
				t.Errorf("requiredTiers()(%q) = %v, want %v", tt.tier, got, tt.want)
			}
		})
	}
}

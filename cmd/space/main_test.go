package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// newTestGlobals returns globals with buffers for stdout and stderr, the
// given environment, and data and cache directories of the test.
func newTestGlobals(t *testing.T, env map[string]string) (g *globals, stdout, stderr *bytes.Buffer) {
	t.Helper()
	e := map[string]string{"SPACE_DATA_DIR": t.TempDir(), "SPACE_CACHE_DIR": t.TempDir()}
	for k, v := range env {
		e[k] = v
	}
	stdout, stderr = new(bytes.Buffer), new(bytes.Buffer)
	g = newGlobals(strings.NewReader(""), stdout, stderr, func(k string) string { return e[k] })
	return g, stdout, stderr
}

func TestRunUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"no verb", nil},
		{"unknown verb", []string{"bogus"}},
		{"unknown global flag", []string{"--bogus", "version"}},
		{"version with an argument", []string{"version", "x"}},
		{"image without a verb", []string{"image"}},
		{"unknown image verb", []string{"image", "bogus"}},
		{"image kernel with an argument", []string{"image", "kernel", "x"}},
		{"rootfs with two sources", []string{"image", "rootfs", "--dir", "d", "--oci", "o", "--out", "x"}},
		{"rootfs --dir without --out", []string{"image", "rootfs", "--dir", "d"}},
		{"empty cache dir", []string{"--cache", "", "image", "kernel"}},
		{"sandbox without a verb", []string{"sandbox"}},
		{"unknown sandbox verb", []string{"sandbox", "bogus"}},
		{"sandbox get without an ID", []string{"sandbox", "get"}},
		{"sandbox create with a bad label", []string{"sandbox", "create", "--label", "novalue"}},
		{"sandbox create with a negative timeout", []string{"sandbox", "create", "--timeout", "-1s"}},
		{"sandbox ls with a bad output format", []string{"sandbox", "ls", "-o", "yaml"}},
		{"exec without a command", []string{"exec", "sb-1"}},
		{"exec with a bad env", []string{"exec", "sb-1", "--env", "=x", "--", "true"}},
		{"exec --detach with -t", []string{"exec", "sb-1", "--detach", "-t", "--", "sh"}},
		{"exec with an unknown flag", []string{"exec", "sb-1", "--bogus", "--", "true"}},
		{"attach with a bad pid", []string{"attach", "sb-1", "x"}},
		{"kill with an unknown signal", []string{"kill", "sb-1", "1", "--signal", "BOGUS"}},
		{"file put with a bad mode", []string{"file", "put", "sb-1", "a", "/a", "--mode", "999"}},
		{"file get with too many arguments", []string{"file", "get", "sb-1", "/a", "b", "c"}},
		{"apikey rm without an ID", []string{"apikey", "rm"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _, _ := newTestGlobals(t, nil)
			var ue usageError
			if _, err := run(t.Context(), g, tt.args); !errors.As(err, &ue) {
				t.Errorf("run(%q) = %v, want a usage error", tt.args, err)
			}
		})
	}
}

func TestRunVersion(t *testing.T) {
	g, stdout, _ := newTestGlobals(t, nil)
	if _, err := run(t.Context(), g, []string{"version"}); err != nil {
		t.Fatalf("run(version) = %v, want nil", err)
	}
	if !strings.HasPrefix(stdout.String(), "space ") {
		t.Errorf("run(version) printed %q, want \"space ...\"", stdout.String())
	}
}

func TestRunHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"help"}, {"sandbox", "--help"}, {"exec", "-h"}} {
		g, stdout, _ := newTestGlobals(t, nil)
		if _, err := run(t.Context(), g, args); err != nil {
			t.Errorf("run(%q) = %v, want nil", args, err)
		}
		if !strings.Contains(stdout.String(), "Usage:") {
			t.Errorf("run(%q) printed %q, want a usage text", args, stdout.String())
		}
	}
}

func TestRunGlobalFlags(t *testing.T) {
	g, _, _ := newTestGlobals(t, nil)
	if _, err := run(t.Context(), g, []string{"version", "--cache", "/c", "-v", "--data-dir", "/d"}); err != nil {
		t.Fatalf("run = %v", err)
	}
	if g.cacheBase != "/c" || !g.verbose || g.dataDir != "/d" {
		t.Errorf("globals after flags = cache %q, verbose %v, data dir %q; want /c, true, /d", g.cacheBase, g.verbose, g.dataDir)
	}
}

// TestRunKeepsCommandFlags checks that flags after run's command belong to
// the command: parsing succeeds and run gets as far as looking for the
// agent.
func TestRunKeepsCommandFlags(t *testing.T) {
	g, _, _ := newTestGlobals(t, nil)
	_, err := run(t.Context(), g, []string{"run", "--agent", "/nonexistent/space-agent", "uname", "-a"})
	var ue usageError
	if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "not found") {
		t.Errorf("run(run ... uname -a) = %v, want the agent-not-found error", err)
	}
}

// TestMetricsListenFlag checks that both host processes take
// --metrics-listen and say it needs a private address.
func TestMetricsListenFlag(t *testing.T) {
	for _, cmd := range []string{"server", "worker"} {
		g, stdout, _ := newTestGlobals(t, nil)
		if _, err := run(t.Context(), g, []string{cmd, "--help"}); err != nil {
			t.Fatalf("run(%s --help) = %v", cmd, err)
		}
		if out := stdout.String(); !strings.Contains(out, "--metrics-listen address") || !strings.Contains(out, "private address") {
			t.Errorf("run(%s --help) = %q, want --metrics-listen address ... private address", cmd, out)
		}
	}
}

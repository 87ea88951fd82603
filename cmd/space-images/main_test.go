package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestWithoutUserinfo(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"https://example.org/space.git", "https://example.org/space.git"},
		{"https://user:secret@example.org/space.git", "https://example.org/space.git"},
		{"https://token@example.org/space", "https://example.org/space"},
		{"git@example.org:team/space.git", "git@example.org:team/space.git"},
	}
	for _, tt := range tests {
		if got := withoutUserinfo(tt.in); got != tt.want {
			t.Errorf("withoutUserinfo(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestRunUsage(t *testing.T) {
	env := map[string]string{"SPACE_CACHE_DIR": t.TempDir()}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"no space binary", nil, env, "--space is required"},
		{"stray argument", []string{"--space", "x", "extra"}, env, "unexpected arguments"},
		{"unknown flag", []string{"--nope"}, env, "unknown flag"},
		{"bad SOURCE_DATE_EPOCH", []string{"--space", "x"}, map[string]string{"SPACE_CACHE_DIR": t.TempDir(), "SOURCE_DATE_EPOCH": "yesterday"}, "SOURCE_DATE_EPOCH"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, &stdout, &stderr, func(k string) string { return tt.env[k] })
			if code != 2 || !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("run(%q) = %d, stderr %q; want 2 and a message with %q", tt.args, code, stderr.String(), tt.wantErr)
			}
		})
	}
}

func TestRunFailure(t *testing.T) {
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string { return map[string]string{"SPACE_CACHE_DIR": t.TempDir()}[k] }
	args := []string{"--space", "/nonexistent/space", "--image", "controlplane", "--out", t.TempDir()}
	if code := run(t.Context(), args, &stdout, &stderr, getenv); code != 1 || !strings.HasPrefix(stderr.String(), "space-images: ") {
		t.Errorf("run(missing binary) = %d, stderr %q; want 1 and a space-images: message", code, stderr.String())
	}
}

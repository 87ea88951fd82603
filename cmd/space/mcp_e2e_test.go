package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"space/api"
	"space/internal/mcpserver"
)

// TestMCPAgainstRealServer drives `space mcp` with the Go MCP SDK's
// client against a real server with real VMs, over stdio (the verb's
// stdin and stdout as pipes) and over streamable HTTP with a bearer
// token: every tool, output cut in the middle, files as text and bytes,
// snapshot and restore, fork, the idle time moved by each call, and
// refusals (a sandbox it did not create, bad arguments) as tool errors.
func TestMCPAgainstRealServer(t *testing.T) {
	env := startRealServer(t)
	getenv := func(k string) string { return env[k] }
	ctx := t.Context()

	// A sandbox made with the API directly is not the MCP server's.
	g := newGlobals(strings.NewReader(""), io.Discard, io.Discard, getenv)
	cl, err := g.client()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	foreign, err := cl.CreateSandbox(ctx, api.CreateSandbox{MemoryMiB: 192})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}

	t.Run("stdio", func(t *testing.T) {
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		var errb bytes.Buffer
		done := make(chan int, 1)
		mctx, stop := context.WithCancel(ctx)
		go func() {
			g := newGlobals(inR, outW, &errb, getenv)
			done <- execute(mctx, g, []string{"mcp", "--idle", "2m", "--label", "stdio-test"})
			outW.Close()
		}()
		defer func() {
			stop()
			inW.Close()
			if code := <-done; code != 0 {
				t.Errorf("space mcp exited %d: %s", code, errb.String())
			}
		}()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "space-test", Version: "1"}, nil).
			Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
		if err != nil {
			t.Fatalf("connect over stdio: %v", err)
		}
		defer cs.Close()
		exerciseMCP(t, cs, foreign.ID)
	})

	// The foreign sandbox goes: the HTTP leg needs the VM slot's room.
	if err := cl.DeleteSandbox(ctx, foreign.ID); err != nil {
		t.Fatalf("setup: %v", err)
	}

	t.Run("http", func(t *testing.T) {
		token := "mcp-test-token-0123456789"
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatalf("setup: %v", err)
		}
		errR, errW := io.Pipe()
		done := make(chan int, 1)
		mctx, stop := context.WithCancel(ctx)
		go func() {
			g := newGlobals(strings.NewReader(""), io.Discard, errW, getenv)
			done <- execute(mctx, g, []string{"mcp", "--http", "127.0.0.1:0", "--token-file", tokenFile, "--idle", "2m"})
			errW.Close()
		}()
		defer func() {
			stop()
			if code := <-done; code != 0 {
				t.Errorf("space mcp --http exited %d", code)
			}
		}()
		line, err := bufio.NewReader(errR).ReadString('\n')
		go io.Copy(io.Discard, errR)
		_, url, ok := strings.Cut(strings.TrimSpace(line), " on ")
		if err != nil || !ok {
			t.Fatalf("space mcp --http said %q, %v; want the URL it serves", line, err)
		}
		// Without the token: refused before MCP.
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		if err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST without a token = %v, %v; want 401", resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
		hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "space-test", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
		if err != nil {
			t.Fatalf("connect over HTTP: %v", err)
		}
		defer cs.Close()
		sb := callOK[mcpserver.Sandbox](t, cs, "create_sandbox", map[string]any{"memory_mib": 256})
		defer callOK[map[string]any](t, cs, "delete_sandbox", map[string]any{"sandbox_id": sb.ID})
		r := callOK[mcpserver.Result](t, cs, "run_code", map[string]any{"sandbox_id": sb.ID, "language": "python",
			"code": "import sys\nprint('over http', sys.version_info[0])"})
		if r.ExitCode != 0 || r.Stdout != "over http 3\n" {
			t.Errorf("run_code over HTTP = %+v", r)
		}
	})
}

type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// exerciseMCP runs every tool through cs; foreign is a sandbox of the
// same team that the MCP server did not create.
func exerciseMCP(t *testing.T, cs *mcp.ClientSession, foreign string) {
	ctx := t.Context()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	want := []string{"create_sandbox", "delete_sandbox", "fork_sandbox", "list_files", "list_sandboxes", "read_file",
		"restore_sandbox", "run_code", "run_command", "snapshot_sandbox", "write_file"}
	if !slices.Equal(names, want) {
		t.Errorf("tools = %v, want %v", names, want)
	}

	before := time.Now()
	sb := callOK[mcpserver.Sandbox](t, cs, "create_sandbox", map[string]any{"memory_mib": 256, "env": map[string]any{"GREETING": "hello"}})
	if sb.State != "running" || sb.ExpiresAt == nil || sb.ExpiresAt.Before(before.Add(110*time.Second)) || sb.ExpiresAt.After(time.Now().Add(130*time.Second)) {
		t.Errorf("create_sandbox = %+v, want running and expiring after the 2m idle time", sb)
	}
	id := map[string]any{"sandbox_id": sb.ID}
	with := func(kv ...any) map[string]any {
		m := map[string]any{"sandbox_id": sb.ID}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}

	r := callOK[mcpserver.Result](t, cs, "run_command", with("command", `echo "$GREETING"; echo err >&2; exit 3`))
	if r.ExitCode != 3 || r.Stdout != "hello\n" || r.Stderr != "err\n" || r.StdoutBytes != 6 {
		t.Errorf("run_command = %+v, want exit 3, hello, err", r)
	}
	r = callOK[mcpserver.Result](t, cs, "run_command", with("command", "wc -c", "stdin", "four"))
	if strings.TrimSpace(r.Stdout) != "4" {
		t.Errorf("run_command with stdin = %+v, want 4", r)
	}
	r = callOK[mcpserver.Result](t, cs, "run_command", with("command", `head -c 300000 /dev/zero | tr '\0' a; printf END`))
	if r.StdoutBytes != 300003 || len(r.Stdout) > 70000 || !strings.HasPrefix(r.Stdout, "aaaa") ||
		!strings.HasSuffix(r.Stdout, "aaEND") || !strings.Contains(r.Stdout, "bytes left out") {
		t.Errorf("run_command of 300 kB: %d bytes, %d kept, want about 64 KiB kept with head, tail and a marker", r.StdoutBytes, len(r.Stdout))
	}
	r = callOK[mcpserver.Result](t, cs, "run_command", with("command", "sleep 30", "timeout_seconds", 1))
	if !r.TimedOut {
		t.Errorf("run_command past its timeout = %+v, want timed_out", r)
	}

	csv := "city,people\nOslo,700000\nBergen,290000\n"
	w := callOK[map[string]any](t, cs, "write_file", with("path", "/root/data/cities.csv", "content", csv))
	if w["size"] != float64(len(csv)) {
		t.Errorf("write_file = %v", w)
	}
	r = callOK[mcpserver.Result](t, cs, "run_code", with("language", "python",
		"code", "import csv\nrows = list(csv.DictReader(open('/root/data/cities.csv')))\nprint(sum(int(r['people']) for r in rows))"))
	if r.ExitCode != 0 || r.Stdout != "990000\n" {
		t.Errorf("run_code python on the CSV = %+v", r)
	}
	r = callOK[mcpserver.Result](t, cs, "run_code", with("language", "shell", "code", "cd /root/data && ls"))
	if r.Stdout != "cities.csv\n" {
		t.Errorf("run_code shell = %+v", r)
	}
	r = callOK[mcpserver.Result](t, cs, "run_code", with("language", "python", "code", "raise SystemExit('boom')"))
	if r.ExitCode != 1 || !strings.Contains(r.Stderr, "boom") {
		t.Errorf("run_code that fails = %+v, want exit 1 with boom", r)
	}
	rd := callOK[map[string]any](t, cs, "read_file", with("path", "/root/data/cities.csv"))
	if rd["content"] != csv || rd["encoding"] != "utf-8" {
		t.Errorf("read_file = %v", rd)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, 'x'}
	callOK[map[string]any](t, cs, "write_file", with("path", "/root/data/blob", "content", base64.StdEncoding.EncodeToString(bin), "encoding", "base64", "mode", "600"))
	rd = callOK[map[string]any](t, cs, "read_file", with("path", "/root/data/blob"))
	if rd["encoding"] != "base64" || rd["content"] != base64.StdEncoding.EncodeToString(bin) {
		t.Errorf("read_file of bytes = %v", rd)
	}
	ls := callOK[map[string]any](t, cs, "list_files", with("path", "/root/data"))
	if b, _ := json.Marshal(ls["entries"]); !strings.Contains(string(b), `"name":"blob"`) || !strings.Contains(string(b), `"mode":"600"`) ||
		!strings.Contains(string(b), `"name":"cities.csv"`) {
		t.Errorf("list_files = %s", b)
	}

	// Roll back after a mistake.
	snap := callOK[map[string]any](t, cs, "snapshot_sandbox", with("name", "mcp-before-mistake"))
	callOK[mcpserver.Result](t, cs, "run_command", with("command", "rm -rf /root/data"))
	restored := callOK[mcpserver.Sandbox](t, cs, "restore_sandbox", with("snapshot", snap["snapshot_id"]))
	if restored.State != "running" {
		t.Errorf("restore_sandbox = %+v", restored)
	}
	if rd := callOK[map[string]any](t, cs, "read_file", with("path", "/root/data/cities.csv")); rd["content"] != csv {
		t.Errorf("after restore read_file = %v, want the CSV back", rd)
	}

	// Fork to try two approaches.
	forked := callOK[struct {
		Sandboxes []mcpserver.Sandbox `json:"sandboxes"`
	}](t, cs, "fork_sandbox", id)
	if len(forked.Sandboxes) != 1 {
		t.Fatalf("fork_sandbox = %+v", forked)
	}
	child := forked.Sandboxes[0]
	if child.ExpiresAt == nil || child.ExpiresAt.After(time.Now().Add(130*time.Second)) {
		t.Errorf("fork child = %+v, want the idle time", child)
	}
	callOK[mcpserver.Result](t, cs, "run_command", map[string]any{"sandbox_id": child.ID, "command": "echo child > /root/data/who"})
	if r := callOK[mcpserver.Result](t, cs, "run_command", with("command", "cat /root/data/who 2>&1 || true")); strings.Contains(r.Stdout, "child") {
		t.Errorf("the parent sees the child's file: %+v", r)
	}
	list := callOK[struct {
		Sandboxes []mcpserver.Sandbox `json:"sandboxes"`
	}](t, cs, "list_sandboxes", nil)
	if len(list.Sandboxes) != 2 {
		t.Errorf("list_sandboxes = %+v, want the sandbox and its child", list)
	}
	callOK[map[string]any](t, cs, "delete_sandbox", map[string]any{"sandbox_id": child.ID})

	// Refusals are tool errors the model can read.
	for _, tc := range []struct {
		tool string
		args map[string]any
		says string
	}{
		{"run_command", map[string]any{"sandbox_id": foreign, "command": "true"}, "not created by this MCP server"},
		{"delete_sandbox", map[string]any{"sandbox_id": foreign}, "not created by this MCP server"},
		{"run_code", with("language", "cobol", "code", "x"), "want python, javascript or shell"},
		{"run_command", with("command", "true", "timeout_seconds", 7200), "timeout_seconds 7200"},
		{"read_file", with("path", "/no/such/file"), "no such file"},
		{"write_file", with("path", "/root/x", "content", "%%%", "encoding", "base64"), "not base64"},
		{"run_command", map[string]any{"sandbox_id": "sbx_nosuchsandboxxxxxxxx", "command": "true"}, "not found"},
	} {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tc.tool, Arguments: tc.args})
		if err != nil || !res.IsError || !strings.Contains(text(res), tc.says) {
			t.Errorf("%s %v = %v, %v; want a tool error saying %q", tc.tool, tc.args, text(res), err, tc.says)
		}
	}
	// Big files are refused with their size, not sent.
	callOK[mcpserver.Result](t, cs, "run_command", with("command", "head -c 2000000 /dev/urandom > /root/big"))
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: with("path", "/root/big")})
	if err != nil || !res.IsError || !strings.Contains(text(res), "larger than") {
		t.Errorf("read_file of 2 MB = %d bytes of text, error %v, %v; want refused", len(text(res)), res != nil && res.IsError, err)
	}

	callOK[map[string]any](t, cs, "delete_sandbox", id)
	list = callOK[struct {
		Sandboxes []mcpserver.Sandbox `json:"sandboxes"`
	}](t, cs, "list_sandboxes", nil)
	if len(list.Sandboxes) != 0 {
		t.Errorf("after delete list_sandboxes = %+v, want none", list)
	}
}

// callOK calls a tool that must succeed and decodes its structured
// result.
func callOK[T any](t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) T {
	t.Helper()
	var out T
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s %v: tool error %s", name, args, text(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: result %s: %v", name, b, err)
	}
	return out
}

// text is the text content of a tool result.
func text(res *mcp.CallToolResult) string {
	if res == nil {
		return ""
	}
	var s []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s = append(s, tc.Text)
		}
	}
	return strings.Join(s, "\n")
}

// TestMCPFlags checks the refusals of space mcp before it serves: a short
// idle time, a token file without --http, and a non-loopback address
// without a token.
func TestMCPFlags(t *testing.T) {
	f := newFakeAPI(t)
	for _, tc := range []struct {
		args  []string
		usage bool
		says  string
	}{
		{[]string{"mcp", "--idle", "10s"}, true, "--idle 10s: want at least 1m"},
		{[]string{"mcp", "--token-file", "/x"}, true, "--token-file is for --http"},
		{[]string{"mcp", "--http", "0.0.0.0:0"}, false, "not a loopback address"},
	} {
		g, _, _ := newTestGlobals(t, f.env())
		_, err := run(t.Context(), g, tc.args)
		var ue usageError
		if err == nil || errors.As(err, &ue) != tc.usage || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("run(%q) = %v, want a usage error %v saying %q", tc.args, err, tc.usage, tc.says)
		}
	}
}

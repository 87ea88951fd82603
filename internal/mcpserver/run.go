package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"space/api"
)

type commandIn struct {
	SandboxID      string            `json:"sandbox_id"`
	Command        string            `json:"command" jsonschema:"a shell command line, run by /bin/sh -c"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory (default /)"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"more environment variables"`
	User           string            `json:"user,omitempty" jsonschema:"user to run as (default root)"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text given to the command's standard input"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this long (default 120, at most 3600)"`
}

type codeIn struct {
	SandboxID      string `json:"sandbox_id"`
	Language       string `json:"language" jsonschema:"python, javascript (needs node in the template) or shell"`
	Code           string `json:"code" jsonschema:"the program's source"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty" jsonschema:"kill it after this long (default 120, at most 3600)"`
}

// Result is how a command or snippet ended, with its output: each stream
// beyond 64 KiB keeps its first and last 32 KiB.
type Result struct {
	ExitCode    int    `json:"exit_code"`
	Signal      int    `json:"signal,omitempty"`
	TimedOut    bool   `json:"timed_out,omitempty"`
	Stdout      string `json:"stdout"`
	Stderr      string `json:"stderr"`
	StdoutBytes int64  `json:"stdout_bytes" jsonschema:"bytes the command wrote to stdout, all of them"`
	StderrBytes int64  `json:"stderr_bytes" jsonschema:"bytes the command wrote to stderr, all of them"`
}

// interpreters run a snippet read from stdin, by language.
var interpreters = map[string][]string{
	"python":     {"python3", "-"},
	"javascript": {"node", "-"},
	"shell":      {"/bin/sh", "-s"},
}

func (s *Server) registerRun(m *mcp.Server) {
	mcp.AddTool(m, &mcp.Tool{Name: "run_command", Description: "Run a shell command in a sandbox and return its exit code, stdout and stderr."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in commandIn) (*mcp.CallToolResult, Result, error) {
			if strings.TrimSpace(in.Command) == "" {
				return nil, Result{}, fmt.Errorf("command is empty")
			}
			return s.run(ctx, in.SandboxID, api.Exec{Shell: in.Command, Cwd: in.Cwd, Env: in.Env, User: in.User, Stdin: []byte(in.Stdin)}, in.TimeoutSeconds)
		})
	mcp.AddTool(m, &mcp.Tool{Name: "run_code", Description: "Run a snippet of Python, JavaScript or shell in a sandbox and return its exit code, stdout and stderr. " +
		"Files it writes stay in the sandbox for later calls."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in codeIn) (*mcp.CallToolResult, Result, error) {
			argv, ok := interpreters[in.Language]
			if !ok {
				return nil, Result{}, fmt.Errorf("language %q: want python, javascript or shell", in.Language)
			}
			return s.run(ctx, in.SandboxID, api.Exec{Command: argv, Cwd: "/root", Stdin: []byte(in.Code)}, in.TimeoutSeconds)
		})
}

// run runs req in sandbox id for at most timeoutSeconds (0: the default),
// keeping the sandbox for the run plus the idle time.
func (s *Server) run(ctx context.Context, id string, req api.Exec, timeoutSeconds int64) (*mcp.CallToolResult, Result, error) {
	timeout := time.Duration(timeoutSeconds) * time.Second
	switch {
	case timeoutSeconds < 0 || timeout > maxTimeout:
		return nil, Result{}, fmt.Errorf("timeout_seconds %d: want 1..%d", timeoutSeconds, int64(maxTimeout/time.Second))
	case timeout == 0:
		timeout = defaultTimeout
	}
	if err := s.own(ctx, id); err != nil {
		return nil, Result{}, err
	}
	if err := s.touch(ctx, id, s.idle+timeout); err != nil {
		return nil, Result{}, err
	}
	req.TimeoutSeconds = int64(timeout / time.Second)
	req.KillOnDisconnect = true
	var stdout, stderr capture
	exit, err := s.c.Exec(ctx, id, req, &stdout, &stderr)
	if err != nil {
		return nil, Result{}, err
	}
	if err := s.touch(ctx, id, s.idle); err != nil {
		return nil, Result{}, err
	}
	return nil, Result{ExitCode: exit.Code, Signal: exit.Signal, TimedOut: exit.TimedOut,
		Stdout: stdout.String(), Stderr: stderr.String(), StdoutBytes: stdout.n, StderrBytes: stderr.n}, nil
}

// capture keeps the first and last maxOutput/2 bytes written to it and
// counts all of them.
type capture struct {
	head, tail []byte // tail is a ring once full
	wrapped    bool
	next       int // where the ring writes next
	n          int64
}

func (c *capture) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	const half = maxOutput / 2
	q := p
	if room := half - len(c.head); room > 0 {
		k := min(room, len(q))
		c.head = append(c.head, q[:k]...)
		q = q[k:]
	}
	for len(q) > 0 {
		if len(c.tail) < half {
			k := min(half-len(c.tail), len(q))
			c.tail = append(c.tail, q[:k]...)
			q = q[k:]
			continue
		}
		if len(q) >= half {
			q = q[len(q)-half:]
		}
		k := copy(c.tail[c.next:], q)
		q = q[k:]
		c.next = (c.next + k) % half
		c.wrapped = true
	}
	return len(p), nil
}

// String returns what was kept as valid UTF-8, with a marker where bytes
// were dropped.
func (c *capture) String() string {
	tail := c.tail
	if c.wrapped {
		tail = append(append([]byte(nil), c.tail[c.next:]...), c.tail[:c.next]...)
	}
	kept := int64(len(c.head) + len(tail))
	if kept == c.n {
		return strings.ToValidUTF8(string(c.head)+string(tail), "\uFFFD")
	}
	return strings.ToValidUTF8(string(c.head), "\uFFFD") +
		fmt.Sprintf("\n[... %d bytes left out ...]\n", c.n-kept) +
		strings.ToValidUTF8(string(tail), "\uFFFD")
}

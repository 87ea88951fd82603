// Package mcpserver offers SPACE to Model Context Protocol clients (agent
// frameworks, IDEs, chat apps) as tools: create a sandbox, run a command
// or a snippet of code in it, move files, snapshot, fork, restore and
// delete it. It speaks to the REST API with the Go client, so it runs
// wherever the CLI does and holds no state of its own that matters: the
// sandboxes it made carry its label, and the control plane deletes each
// once it has gone Idle without a tool call, whether or not this process
// is still there.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"space/api"
	"space/client"
)

// LabelKey is the label the sandboxes this server creates carry, with
// Config.Label as its value. Its tools act on those sandboxes only.
const LabelKey = "space-mcp"

// Defaults of Config.
const (
	DefaultLabel = "default"
	DefaultIdle  = 15 * time.Minute
)

// Bounds of what a tool returns to the model: output beyond them is cut
// in the middle, file reads beyond maxRead are refused with the size.
const (
	maxOutput      = 64 << 10 // per stream of a command
	maxRead        = 1 << 20
	defaultTimeout = 120 * time.Second // of a command given none
	maxTimeout     = time.Hour
)

// Config configures a server.
type Config struct {
	// Client reaches the API. Required.
	Client *client.Client
	// Label is the value of LabelKey on the sandboxes this server creates
	// and the only ones it touches; "" = DefaultLabel. Servers with
	// different labels do not see each other's sandboxes.
	Label string
	// Idle is how long a sandbox may go without a tool call before the
	// control plane deletes it; 0 = DefaultIdle.
	Idle time.Duration
	// Version is reported to clients.
	Version string
}

// Server holds the tools. It is safe for concurrent use by the sessions
// of an HTTP transport.
type Server struct {
	c     *client.Client
	label string
	idle  time.Duration

	mu sync.Mutex
	// +checklocks:mu
	owned map[string]bool // sandboxes seen to carry the label
}

// New returns the MCP server of cfg.
func New(cfg Config) (*mcp.Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("mcpserver: a client is required")
	}
	if cfg.Idle < 0 || (cfg.Idle > 0 && cfg.Idle < time.Minute) {
		return nil, fmt.Errorf("mcpserver: idle time %v: want at least 1m", cfg.Idle)
	}
	s := &Server{c: cfg.Client, label: cfg.Label, idle: cfg.Idle, owned: map[string]bool{}}
	if s.label == "" {
		s.label = DefaultLabel
	}
	if s.idle == 0 {
		s.idle = DefaultIdle
	}
	m := mcp.NewServer(&mcp.Implementation{Name: "space", Title: "SPACE sandboxes", Version: cfg.Version}, &mcp.ServerOptions{
		Instructions: "SPACE runs code in disposable micro-VM sandboxes. Create one with create_sandbox, " +
			"then run commands or code in it, read and write its files, snapshot, fork or restore it. " +
			"A sandbox reaches only the network hosts it was created with (allow). " +
			fmt.Sprintf("Sandboxes are deleted after %v without a tool call; delete_sandbox frees one at once.", s.idle),
	})
	s.register(m)
	return m, nil
}

// touch keeps sandbox id for d from now (the idle time, or longer while
// a command runs).
func (s *Server) touch(ctx context.Context, id string, d time.Duration) error {
	_, err := s.c.SetTimeout(ctx, id, d)
	return err
}

// own checks that sandbox id is one of this server's and keeps it for
// the idle time from now.
func (s *Server) own(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("sandbox_id is required")
	}
	s.mu.Lock()
	known := s.owned[id]
	s.mu.Unlock()
	if !known {
		sb, err := s.c.Sandbox(ctx, id)
		if err != nil {
			return err
		}
		if sb.Labels[LabelKey] != s.label {
			return fmt.Errorf("sandbox %s was not created by this MCP server (it lacks the label %s=%s): its tools act only on their own sandboxes", id, LabelKey, s.label)
		}
		s.remember(id)
	}
	return s.touch(ctx, id, s.idle)
}

func (s *Server) remember(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.owned[id] = true
	}
}

func (s *Server) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.owned, id)
}

// Sandbox is a sandbox as the tools return it.
type Sandbox struct {
	ID        string     `json:"sandbox_id"`
	State     string     `json:"state"`
	Template  string     `json:"template"`
	VCPUs     int        `json:"vcpus"`
	MemoryMiB int64      `json:"memory_mib"`
	ExpiresAt *time.Time `json:"expires_at,omitempty" jsonschema:"when it is deleted unless a tool call comes first"`
}

func sandboxOf(sb api.Sandbox) Sandbox {
	return Sandbox{ID: sb.ID, State: sb.State, Template: sb.Template, VCPUs: sb.VCPUs, MemoryMiB: sb.MemoryMiB, ExpiresAt: sb.ExpiresAt}
}

type createIn struct {
	Template  string            `json:"template,omitempty" jsonschema:"template to start from (default: the server's default template, Debian with python3)"`
	VCPUs     int               `json:"vcpus,omitempty" jsonschema:"virtual CPUs (default 1)"`
	MemoryMiB int64             `json:"memory_mib,omitempty" jsonschema:"guest memory in MiB (default 512)"`
	Allow     []string          `json:"allow,omitempty" jsonschema:"network allow-list: host names (*.suffix for subdomains), IPs or CIDRs, each with an optional :port; empty = no network"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables of every command"`
}

type idIn struct {
	SandboxID string `json:"sandbox_id"`
}

type listOut struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

type deleted struct {
	Deleted string `json:"deleted"`
}

func (s *Server) register(m *mcp.Server) {
	mcp.AddTool(m, &mcp.Tool{Name: "create_sandbox", Description: "Create a sandbox (a micro-VM) and return its sandbox_id. " +
		"It has no network unless allow names hosts it may reach."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, Sandbox, error) {
			req := api.CreateSandbox{Template: in.Template, VCPUs: in.VCPUs, MemoryMiB: in.MemoryMiB, Env: in.Env,
				TimeoutSeconds: int64(s.idle / time.Second), OnTimeout: "delete",
				Labels: map[string]string{LabelKey: s.label}}
			if len(in.Allow) > 0 {
				req.Network = &api.Network{Allow: in.Allow}
			}
			sb, err := s.c.CreateSandbox(ctx, req)
			if err != nil {
				return nil, Sandbox{}, err
			}
			s.remember(sb.ID)
			return nil, sandboxOf(sb), nil
		})
	mcp.AddTool(m, &mcp.Tool{Name: "list_sandboxes", Description: "List the sandboxes this server created that still exist."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, listOut, error) {
			sbs, err := s.c.Sandboxes(ctx, client.ListOptions{Labels: map[string]string{LabelKey: s.label}})
			if err != nil {
				return nil, listOut{}, err
			}
			out := listOut{Sandboxes: []Sandbox{}}
			for _, sb := range sbs {
				out.Sandboxes = append(out.Sandboxes, sandboxOf(sb))
			}
			return nil, out, nil
		})
	mcp.AddTool(m, &mcp.Tool{Name: "delete_sandbox", Description: "Delete a sandbox and everything in it."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in idIn) (*mcp.CallToolResult, deleted, error) {
			if err := s.own(ctx, in.SandboxID); err != nil {
				return nil, deleted{}, err
			}
			if err := s.c.DeleteSandbox(ctx, in.SandboxID); err != nil {
				return nil, deleted{}, err
			}
			s.forget(in.SandboxID)
			return nil, deleted{Deleted: in.SandboxID}, nil
		})
	s.registerRun(m)
	s.registerFiles(m)
	s.registerSnapshots(m)
}

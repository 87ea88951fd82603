package mcpserver

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type snapshotIn struct {
	SandboxID string `json:"sandbox_id"`
	Name      string `json:"name,omitempty" jsonschema:"a name to restore it by (unique; letters, digits, _ . -)"`
}

type snapshotOut struct {
	SnapshotID string `json:"snapshot_id"`
	Name       string `json:"name,omitempty"`
	SandboxID  string `json:"sandbox_id"`
}

type forkIn struct {
	SandboxID string `json:"sandbox_id"`
	Count     int    `json:"count,omitempty" jsonschema:"how many copies (default 1, at most 16)"`
}

type restoreIn struct {
	SandboxID string `json:"sandbox_id"`
	Snapshot  string `json:"snapshot" jsonschema:"snapshot_id or name of a snapshot to roll the sandbox back to"`
}

func (s *Server) registerSnapshots(m *mcp.Server) {
	mcp.AddTool(m, &mcp.Tool{Name: "snapshot_sandbox", Description: "Snapshot a running sandbox (memory, processes and files) " +
		"so that restore_sandbox can roll it back to this point. Snapshots are kept until deleted with the CLI or API."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in snapshotIn) (*mcp.CallToolResult, snapshotOut, error) {
			if err := s.own(ctx, in.SandboxID); err != nil {
				return nil, snapshotOut{}, err
			}
			sn, err := s.c.CreateSnapshot(ctx, in.SandboxID, in.Name)
			if err != nil {
				return nil, snapshotOut{}, err
			}
			return nil, snapshotOut{SnapshotID: sn.ID, Name: sn.Name, SandboxID: in.SandboxID}, nil
		})
	mcp.AddTool(m, &mcp.Tool{Name: "restore_sandbox", Description: "Roll a sandbox back to one of its snapshots, in place: " +
		"its memory, processes and files become what they were then."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in restoreIn) (*mcp.CallToolResult, Sandbox, error) {
			if err := s.own(ctx, in.SandboxID); err != nil {
				return nil, Sandbox{}, err
			}
			if in.Snapshot == "" {
				return nil, Sandbox{}, fmt.Errorf("snapshot is required")
			}
			sb, err := s.c.RestoreSandbox(ctx, in.SandboxID, in.Snapshot)
			if err != nil {
				return nil, Sandbox{}, err
			}
			return nil, sandboxOf(sb), nil
		})
	mcp.AddTool(m, &mcp.Tool{Name: "fork_sandbox", Description: "Copy a running sandbox, memory and processes included, " +
		"into new sandboxes that go on independently (to try several approaches from one state)."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in forkIn) (*mcp.CallToolResult, listOut, error) {
			n := in.Count
			if n == 0 {
				n = 1
			}
			if n < 1 || n > 16 {
				return nil, listOut{}, fmt.Errorf("count %d: want 1..16", in.Count)
			}
			if err := s.own(ctx, in.SandboxID); err != nil {
				return nil, listOut{}, err
			}
			children, err := s.c.ForkSandbox(ctx, in.SandboxID, n)
			if err != nil {
				return nil, listOut{}, err
			}
			out := listOut{Sandboxes: []Sandbox{}}
			for _, sb := range children {
				// Children carry the parent's labels; they idle out as it does.
				s.remember(sb.ID)
				if got, err := s.c.SetTimeout(ctx, sb.ID, s.idle); err == nil {
					sb = got
				} else {
					return nil, listOut{}, fmt.Errorf("fork made %s but could not set its idle time: %w", sb.ID, err)
				}
				out.Sandboxes = append(out.Sandboxes, sandboxOf(sb))
			}
			return nil, out, nil
		})
}

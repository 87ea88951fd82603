package fcapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"space/internal/errkind"
)

// Which kind a 400 answer carries: configuration requests are mostly
// rejected for their values, lifecycle requests for the VM's state.
var (
	badValue = errkind.InvalidArgument
	badState = errkind.FailedPrecondition
)

// Instance returns GET /: the instance id, state and version.
func (c *Client) Instance(ctx context.Context) (InstanceInfo, error) {
	var info InstanceInfo
	err := c.do(ctx, http.MethodGet, "/", nil, &info, badState)
	return info, err
}

// Version returns the Firecracker version (GET /version), e.g. "1.16.1".
func (c *Client) Version(ctx context.Context) (string, error) {
	var v struct {
		FirecrackerVersion string `json:"firecracker_version"`
	}
	if err := c.do(ctx, http.MethodGet, "/version", nil, &v, badState); err != nil {
		return "", err
	}
	return v.FirecrackerVersion, nil
}

// PutLogger configures the logger.
func (c *Client) PutLogger(ctx context.Context, l Logger) error {
	return c.do(ctx, http.MethodPut, "/logger", l, nil, badValue)
}

// PutMetrics configures the metrics sink.
func (c *Client) PutMetrics(ctx context.Context, m Metrics) error {
	return c.do(ctx, http.MethodPut, "/metrics", m, nil, badValue)
}

// PutBootSource sets the kernel, initrd and command line.
func (c *Client) PutBootSource(ctx context.Context, b BootSource) error {
	return c.do(ctx, http.MethodPut, "/boot-source", b, nil, badValue)
}

// PutDrive adds or replaces a drive before boot.
func (c *Client) PutDrive(ctx context.Context, d Drive) error {
	if err := ValidID(d.DriveID); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/drives/"+d.DriveID, d, nil, badValue)
}

// PatchDrive updates a drive of a running VM.
func (c *Client) PatchDrive(ctx context.Context, d DriveUpdate) error {
	if err := ValidID(d.DriveID); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPatch, "/drives/"+d.DriveID, d, nil, badState)
}

// PutMachineConfig sets vCPUs and memory.
func (c *Client) PutMachineConfig(ctx context.Context, m MachineConfig) error {
	return c.do(ctx, http.MethodPut, "/machine-config", m, nil, badValue)
}

// PutNetworkInterface adds a network interface before boot.
func (c *Client) PutNetworkInterface(ctx context.Context, n NetworkInterface) error {
	if err := ValidID(n.IfaceID); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPut, "/network-interfaces/"+n.IfaceID, n, nil, badValue)
}

// PutVsock sets the vsock device; Firecracker binds its unix socket now.
func (c *Client) PutVsock(ctx context.Context, v Vsock) error {
	return c.do(ctx, http.MethodPut, "/vsock", v, nil, badValue)
}

// PutEntropy adds the virtio-rng device.
func (c *Client) PutEntropy(ctx context.Context, e Entropy) error {
	return c.do(ctx, http.MethodPut, "/entropy", e, nil, badValue)
}

// PutBalloon adds the balloon device before boot.
func (c *Client) PutBalloon(ctx context.Context, b Balloon) error {
	return c.do(ctx, http.MethodPut, "/balloon", b, nil, badValue)
}

// PatchBalloon sets the balloon's target after boot.
func (c *Client) PatchBalloon(ctx context.Context, b BalloonUpdate) error {
	return c.do(ctx, http.MethodPatch, "/balloon", b, nil, badState)
}

// BalloonStatistics returns the balloon's statistics; they must have been
// enabled (StatsPollingIntervalS) before boot.
func (c *Client) BalloonStatistics(ctx context.Context) (BalloonStats, error) {
	var s BalloonStats
	err := c.do(ctx, http.MethodGet, "/balloon/statistics", nil, &s, badState)
	return s, err
}

// Action performs a PUT /actions action.
func (c *Client) Action(ctx context.Context, a ActionType) error {
	switch a {
	case InstanceStart, SendCtrlAltDel, FlushMetrics:
	default:
		return fmt.Errorf("firecracker action %q: %w", a, errkind.InvalidArgument)
	}
	return c.do(ctx, http.MethodPut, "/actions", action{ActionType: a}, nil, badState)
}

// PatchVM pauses or resumes the vCPUs. Both are idempotent.
func (c *Client) PatchVM(ctx context.Context, s VMState) error {
	if s != Paused && s != Resumed {
		return fmt.Errorf("firecracker vm state %q: %w", s, errkind.InvalidArgument)
	}
	return c.do(ctx, http.MethodPatch, "/vm", vmPatch{State: s}, nil, badState)
}

// CreateSnapshot writes a snapshot of the paused VM; when it returns nil
// both files are written and fsynced.
func (c *Client) CreateSnapshot(ctx context.Context, s SnapshotCreate) error {
	if s.SnapshotType != "" && s.SnapshotType != Full && s.SnapshotType != Diff {
		return fmt.Errorf("firecracker snapshot type %q: %w", s.SnapshotType, errkind.InvalidArgument)
	}
	return c.do(ctx, http.MethodPut, "/snapshot/create", s, nil, badState)
}

// LoadSnapshot loads a snapshot into a fresh process. If Firecracker
// rejects it, the process exits: treat any error as the process being gone.
func (c *Client) LoadSnapshot(ctx context.Context, s SnapshotLoad) error {
	if (s.MemBackend == nil) == (s.MemFilePath == "") {
		return fmt.Errorf("firecracker snapshot load: want exactly one of mem_backend and mem_file_path: %w", errkind.InvalidArgument)
	}
	if b := s.MemBackend; b != nil && b.BackendType != BackendFile && b.BackendType != BackendUffd {
		return fmt.Errorf("firecracker snapshot load: backend type %q: %w", b.BackendType, errkind.InvalidArgument)
	}
	for _, o := range s.NetworkOverrides {
		if err := ValidID(o.IfaceID); err != nil {
			return err
		}
	}
	return c.do(ctx, http.MethodPut, "/snapshot/load", s, nil, badState)
}

// Version is a Firecracker release number. Pre holds a suffix such as
// "dev".
type Version struct {
	Major, Minor, Patch int
	Pre                 string
}

// ParseVersion parses "1.16.1", "v1.16.1" or "1.17.0-dev".
func ParseVersion(s string) (Version, error) {
	rest := strings.TrimPrefix(strings.TrimSpace(s), "v")
	rest, pre, _ := strings.Cut(rest, "-")
	parts := strings.Split(rest, ".")
	if len(parts) != 3 {
		return Version{}, fmt.Errorf("firecracker version %q: want major.minor.patch: %w", s, errkind.InvalidArgument)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Version{}, fmt.Errorf("firecracker version %q: want major.minor.patch: %w", s, errkind.InvalidArgument)
		}
		n[i] = v
	}
	return Version{Major: n[0], Minor: n[1], Patch: n[2], Pre: pre}, nil
}

// AtLeast reports whether v is major.minor or later. A pre-release of
// major.minor counts as major.minor: main-branch builds carry the
// features of the release they lead to.
func (v Version) AtLeast(major, minor int) bool {
	if v.Major != major {
		return v.Major > major
	}
	return v.Minor >= minor
}

func (v Version) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

// Package vmm is the hypervisor contract the worker consumes: boot a guest,
// pause and resume it, stop it, re-attach to it after a worker restart,
// and (where a driver can) snapshot and restore it.
//
// Implementations live in subpackages (vmm/qemu, vmm/firecracker). Every
// implementation runs the conformance suite in vmm/vmmtest. Optional
// abilities are separate interfaces, found by type assertion:
//
//	if s, ok := vm.(vmm.Snapshotter); ok { ... }
//
// A VM is a process the driver started. Its Handle is plain data: the
// worker persists it before it acknowledges a sandbox, and a new worker
// process calls Driver.Recover with it to get the VM back without
// restarting the guest.
package vmm

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"time"

	"space/internal/errkind"
)

// ErrExited is returned by calls on a VM whose VMM process has ended.
var ErrExited = fmt.Errorf("vm has exited: %w", errkind.FailedPrecondition)

// ErrGone is returned by Recover when the handle's process no longer runs
// (or its pid now belongs to another process).
var ErrGone = fmt.Errorf("vm process is gone: %w", errkind.NotFound)

// ErrIncompatible is returned by Restore for a snapshot taken by another
// VMM, version, machine type or device layout.
var ErrIncompatible = fmt.Errorf("snapshot is incompatible with this vmm: %w", errkind.FailedPrecondition)

// Spec describes a guest to boot.
type Spec struct {
	// RunDir is the VM's private directory (sockets, memory file, logs).
	// The driver creates it 0700. It belongs on a file system where the
	// memory file can live (tmpfs, or reflink-capable storage for
	// snapshots) and must be short enough for unix socket paths.
	RunDir string
	// Kernel is the guest kernel: a PVH/ELF vmlinux (both drivers) or a
	// bzImage (QEMU only). Required.
	Kernel string
	// Initrd is the initramfs, or "" for none.
	Initrd string
	// Cmdline is the kernel command line. The driver may append its own
	// arguments (the agent channel's name, for one).
	Cmdline string
	// VCPUs is the number of vCPUs; 0 = 1.
	VCPUs int
	// MemoryMiB is the guest RAM. Required.
	MemoryMiB int
	// Disks are virtio-blk disks, /dev/vda first.
	Disks []Disk
	// NIC is the guest's network interface, or nil for none.
	NIC *NIC
	// Placer puts the VMM process into its control group as it starts,
	// or nil to leave it in the caller's.
	Placer Placer
	// MemoryPath is where a driver that backs guest RAM with a file puts
	// it, "" = inside RunDir. Reflink-capable storage makes snapshots,
	// restores and forks share the file's extents instead of copying it.
	// Firecracker, whose restored guests map the snapshot's file, keeps a
	// link there to the memory of the guest's last snapshot or restore,
	// the base its diffs merge onto; it must be on the snapshots' file
	// system. The file must not exist; Stop removes it.
	MemoryPath string
	// TakeSnapshot, for a restore, gives the snapshot directory to the
	// new VM: the driver may move its memory file and writable disks
	// into place instead of copying them (a reflink copy still costs in
	// proportion to the file's extents). The snapshot is spent
	// afterwards, whether the restore succeeded or not: the caller
	// removes it. For a snapshot restored once and dropped (a fork's
	// last child).
	TakeSnapshot bool
}

// Placer places a process in a control group (cgroup.Group implements
// it). Place prepares cmd before it starts (it may set SysProcAttr fields
// and wrap the program, keeping ExtraFiles' descriptor numbers); after
// must then be called with the new pid (it does what could not be done
// atomically, and until then the program does not run), and release once
// the process has started or failed to.
type Placer interface {
	Place(cmd *exec.Cmd) (after func(pid int) error, release func(), err error)
}

// Disk is one raw disk image.
type Disk struct {
	Path     string
	ReadOnly bool
}

// NIC connects the guest to a tap device the worker prepared (in a network
// namespace of its own); the far end is the sandbox's egress gateway.
type NIC struct {
	// Socket, when set, is a unix socket path at which the VMM accepts
	// the NIC's backend: a userspace network stack (see package egress)
	// connects there and exchanges Ethernet frames, each after its
	// length (4 bytes, big endian). It may reconnect after a
	// disconnect. TapName and Netns are then unused.
	Socket  string
	TapName string // the tap device
	// Netns is the path of the network namespace the tap lives in (e.g.
	// /run/netns/<name>); "" = the VMM's own. QEMU gets the tap as an open
	// descriptor, so QEMU itself stays in the host's namespace.
	Netns string
	MAC   string // guest MAC, e.g. 02:fc:00:00:00:01
}

// TapNICs is implemented by drivers whose guest NICs can only be tap
// devices the VMM opens by name (Firecracker): the caller makes the tap,
// owned by TapOwner (-1 = root only), in a namespace of the sandbox's
// own, and serves the NIC from the tap's host side. Other drivers also
// take NIC.Socket.
type TapNICs interface {
	TapOwner() int
}

// AgentEndpoint tells the host how to reach the guest agent.
type AgentEndpoint struct {
	// Kind is "unix" (a stream socket carrying the agent channel, such as
	// QEMU's virtio-serial chardev), "hybrid-vsock" (Firecracker's vsock
	// unix socket: send "CONNECT <port>" first) or "vsock" (an AF_VSOCK
	// address on this host: vhost-vsock).
	Kind string `json:"kind"`
	Path string `json:"path,omitempty"` // unix and hybrid-vsock
	CID  uint32 `json:"cid,omitempty"`  // vsock
	Port uint32 `json:"port,omitempty"` // hybrid-vsock and vsock
}

// Handle identifies a running VM across worker restarts. It is plain data:
// persist it as JSON.
type Handle struct {
	Driver    string          `json:"driver"`     // "qemu" or "firecracker"
	Version   string          `json:"version"`    // VMM version
	PID       int             `json:"pid"`        // VMM process
	StartTime uint64          `json:"start_time"` // /proc/<pid>/stat field 22: detects a reused pid
	RunDir    string          `json:"run_dir"`
	Agent     AgentEndpoint   `json:"agent"`
	Accel     string          `json:"accel"`           // "kvm" or "tcg"
	State     json.RawMessage `json:"state,omitempty"` // driver-private
	// Confinement is how the VMM process is confined, or nil where the
	// driver does not say.
	Confinement *Confinement `json:"confinement,omitempty"`
	// Memory is where the guest's RAM lives on the host, or nil where the
	// driver does not keep it in a file the host may map. The agent
	// client reaches the guest's ring through it (package ring).
	Memory *GuestMemory `json:"memory,omitempty"`
}

// Confinement is how a VMM process is confined on its host, as observed
// in /proc once it runs rather than as asked for. A false field is a
// confinement the process lacks.
type Confinement struct {
	UID        uint32 `json:"uid"` // the VMM's user: 0 is root
	GID        uint32 `json:"gid"`
	NoNewPrivs bool   `json:"no_new_privs"`
	Seccomp    bool   `json:"seccomp"` // a seccomp filter (mode 2)
	NetNS      bool   `json:"netns"`   // a network namespace of its own
	MountNS    bool   `json:"mountns"` // a mount namespace of its own
	PIDNS      bool   `json:"pidns"`   // a PID namespace of its own
	Cgroup     bool   `json:"cgroup"`  // a cgroup other than the caller's
	// Missing says what the driver could not apply on this host, and
	// why; "" = nothing.
	Missing string `json:"missing,omitempty"`
}

// String lists the confinement for a log line: "uid=N gid=N" and the
// names of the fields that are true, then what is missing.
func (c Confinement) String() string {
	s := fmt.Sprintf("uid=%d gid=%d", c.UID, c.GID)
	for _, f := range []struct {
		name string
		on   bool
	}{{"no_new_privs", c.NoNewPrivs}, {"seccomp", c.Seccomp}, {"netns", c.NetNS}, {"mountns", c.MountNS}, {"pidns", c.PIDNS}, {"cgroup", c.Cgroup}} {
		if f.on {
			s += " " + f.name
		}
	}
	if c.Missing != "" {
		s += " missing: " + c.Missing
	}
	return s
}

// ProcessInfo describes the VMM process.
type ProcessInfo struct {
	PID     int
	RSS     int64         // resident bytes
	CPUTime time.Duration // user + system
}

// Driver boots and re-attaches VMs.
type Driver interface {
	// Boot starts a VM; it returns once the VMM runs the guest, not when
	// the guest is ready (the caller waits for the agent).
	Boot(ctx context.Context, spec Spec) (VM, error)
	// Recover re-attaches to the VM a Handle describes. ErrGone when it no
	// longer runs.
	Recover(ctx context.Context, h Handle) (VM, error)
}

// VM is a running guest.
type VM interface {
	// Handle returns the VM's persistable identity.
	Handle() Handle
	// Stop asks the VMM to end, kills it after a grace period or when ctx
	// ends, waits for it and removes its run files. Idempotent.
	Stop(ctx context.Context) error
	// Done is closed once the VMM process has exited.
	Done() <-chan struct{}
	// Info describes the VMM process; ErrExited once it ended.
	Info() (ProcessInfo, error)
}

// Detacher is a VM whose host side can let go of it without stopping it:
// what a worker does when it exits (or crashes) and a successor will
// Recover the VM from its Handle. After Detach only Handle may be called.
type Detacher interface {
	Detach() error
}

// Pauser is a VM whose vCPUs can be stopped and restarted.
type Pauser interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// SnapshotOptions shape a snapshot.
type SnapshotOptions struct {
	// Diff asks for a snapshot whose memory is written only where the
	// guest dirtied it since the previous snapshot, where the driver
	// supports it; others take a full one. Firecracker merges the diff
	// onto a copy of the previous snapshot's memory when the VM was
	// started with a MemoryPath (the snapshot is then complete); without
	// one its diff is a layer that is not loadable on its own.
	Diff bool
	// Ephemeral marks a snapshot that only needs to outlive the process
	// that takes it, not a host crash (a fork's, deleted once the
	// children run): its files are not synced.
	Ephemeral bool
	// Paused, when set, is called once the guest is paused and its device
	// state is written, before memory and disks are copied: where a crash
	// hurts most (the worker's crash tests stop there).
	Paused func()
}

// Snapshot describes a snapshot directory: device state, memory and the
// writable disks of one consistent instant, plus metadata that Restore
// checks before it trusts the rest.
type Snapshot struct {
	Dir       string
	Driver    string
	Version   string        // VMM version that wrote it
	Diff      bool          // only memory dirtied since the previous snapshot
	Took      time.Duration // how long the guest was paused
	Reflinked bool          // memory and disks were reflinked, not copied
}

// Snapshotter is a VM that can snapshot itself into a directory. The VM is
// paused for the snapshot and runs again afterwards if it ran before.
type Snapshotter interface {
	Snapshot(ctx context.Context, dir string, opts SnapshotOptions) (*Snapshot, error)
}

// Restorer is a Driver that starts a VM from a snapshot directory, with
// memory mapped from (a copy-on-write copy of) the snapshot's memory file.
// spec gives the new VM's run directory and disks: read-only disks as they
// were, writable disks as paths the snapshot's copies are placed at. A
// snapshot of another VMM, version or device layout is ErrIncompatible.
type Restorer interface {
	Restore(ctx context.Context, dir string, spec Spec) (VM, error)
}

// GuestMemory is a VM's RAM as a file on the host: its path, and where
// each range of guest-physical addresses lies in it.
type GuestMemory struct {
	Path   string     `json:"path"`
	Ranges []MemRange `json:"ranges"`
}

// MemRange is a range of guest-physical memory at an offset of the
// memory file.
type MemRange struct {
	GPA    uint64 `json:"gpa"`
	Offset int64  `json:"offset"`
	Size   uint64 `json:"size"`
}

package proto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"time"

	"space/internal/errkind"
)

// Op names a call. Values are wire format and never change.
type Op string

// The ops of protocol version 1.
const (
	OpHealth      Op = "health"       // -> Result Health
	OpExec        Op = "exec"         // args ExecRequest -> Started, Stdout/Stderr..., Exit
	OpFileRead    Op = "file.read"    // args ReadArgs -> Result FileInfo, Data..., End
	OpFileWrite   Op = "file.write"   // args WriteArgs, host sends Data..., End -> Result WriteResult
	OpFileStat    Op = "file.stat"    // args PathArgs -> Result FileInfo
	OpFileList    Op = "file.list"    // args ListArgs -> Result ListBatch..., End
	OpFileMkdir   Op = "file.mkdir"   // args MkdirArgs -> Result {}
	OpFileRemove  Op = "file.remove"  // args RemoveArgs -> Result {}
	OpFileRename  Op = "file.rename"  // args RenameArgs -> Result {}
	OpPostRestore Op = "post_restore" // args PostRestore -> Result {}
	OpNetwork     Op = "network"      // args NetConfig -> Result {}
	OpShutdown    Op = "shutdown"     // args Shutdown -> Result {}, then the guest powers off

	// OpProcStart starts a process in the agent's process table, where it
	// outlives the stream and the connection. args ProcStart -> Result
	// ProcInfo; with ProcStart.Attach the stream then goes on as OpProcAttach
	// after its Result.
	OpProcStart Op = "proc.start"
	// OpProcAttach attaches the stream to a process of the table, taking
	// over from any earlier attachment. args ProcRef -> Result ProcInfo,
	// Stdout/Stderr..., Exit; the host may send Stdin, StdinEOF, Signal and
	// Resize frames meanwhile. With ProcRef.Share and a live attachment, the
	// stream follows the process alongside that attachment instead: it gets
	// the output written from then on, and the exit.
	OpProcAttach Op = "proc.attach"
	// OpProcList lists the process table ordered by id. -> Result
	// ProcList..., End.
	OpProcList Op = "proc.list"
	// OpProcSignal signals a process group of the table. args ProcSignal ->
	// Result {}.
	OpProcSignal Op = "proc.signal"

	// OpPortProbe reports whether something in the guest accepts TCP
	// connections on a port of its loopback (127.0.0.1 or ::1). args
	// PortProbe -> Result PortState. It came after the first agents
	// shipped: those answer it with an invalid_argument error ("unknown
	// op"), at once.
	OpPortProbe Op = "port.probe"

	// OpRing attaches the session to the agent's ring: a region of guest
	// RAM the host reaches through the VM's memory file (package ring).
	// args {} -> Result RingOffer (the region's guest-physical chunks, and
	// a token the agent wrote in one of its slots); the host maps the
	// chunks, finds the token, and accepts by releasing that slot
	// (Release) -> Result {} once the agent uses the ring too. The stream
	// then carries Release frames both ways until the session ends, and
	// either side may send DataRef frames in place of data, stdout and
	// stderr frames. Right after that Result the agent sends a Result
	// RingFeatures on the stream: what else it takes through the ring.
	// Agents from before it send none, and hosts from before it skip it
	// (they skip every frame there but releases). A host that declines
	// closes the stream. Agents without a ring answer
	// failed_precondition; agents older than the op, invalid_argument.
	OpRing Op = "ring"

	// OpTarRead sends a directory as a tar stream. args PathArgs ->
	// Result {}, Data..., End. OpTarWrite receives a tar stream into a
	// directory: args TarWriteArgs, the host sends Data..., End -> Result
	// TarResult. The archive is unpacked beside the directory first and
	// moved into it only once whole, so a cut stream changes nothing.
	// Agents older than these ops answer invalid_argument ("unknown op").
	OpTarRead  Op = "tar.read"
	OpTarWrite Op = "tar.write"

	// OpFileWatch watches a directory (and with WatchArgs.Recursive its
	// subdirectories, including ones made later) until the host closes
	// the stream. args WatchArgs -> Result {} once the watch is set up,
	// then Result WatchBatch... as things change; an End frame when the
	// watched directory itself went (removed or moved). Agents older
	// than the op answer invalid_argument ("unknown op").
	OpFileWatch Op = "file.watch"
)

// OpMemoryReclaim has the guest give memory it only caches back to the
// host: the agent drops the guest's clean caches and compacts its free
// memory, and the balloon device's free page reporting returns the freed
// blocks. Nothing the guest's processes hold is touched; dropped files are
// read again from disk when used. args {} -> Result Reclaimed. Agents
// without access to the guest's kernel answer failed_precondition; agents
// older than the op, invalid_argument ("unknown op").
const OpMemoryReclaim Op = "memory.reclaim"

// Reclaimed is the guest's free memory around an OpMemoryReclaim.
type Reclaimed struct {
	FreeBefore int64 `json:"free_before"` // bytes (MemFree)
	FreeAfter  int64 `json:"free_after"`
}

// RingOffer is the agent's reply to OpRing.
type RingOffer struct {
	Size   int64    `json:"size"`   // bytes, both halves
	Chunks []uint64 `json:"chunks"` // guest-physical address of each ring.ChunkSize piece, in order
	Slot   int      `json:"slot"`   // the agent's slot holding Token
	Token  string   `json:"token"`  // hex
}

// RingFeatures is what an agent takes through its ring beyond data
// frames (OpRing). A host reads it leniently: later agents add members.
type RingFeatures struct {
	// StdinRefs: the host may send a DataRef of Stdin bytes on an exec or
	// attachment stream, wherever it may send a Stdin frame. The agent
	// releases each one once the bytes are in the process's input (or
	// dropped: the attachment ended, or stdin was closed), and keeps
	// reading the stream to release them until the host closes its side.
	StdinRefs bool `json:"stdin_refs,omitempty"`
	// PageRefs: the agent can send the bytes of files it reads as
	// PagesRef frames (ReadArgs.Pages, and PathArgs.Pages of a tar.read),
	// which the host copies from the VM's memory file and releases on
	// the call's stream.
	PageRefs bool `json:"page_refs,omitempty"`
}

// Port probe timeouts (PortProbe.TimeoutMS).
const (
	PortProbeTimeout    = time.Second      // when TimeoutMS is 0
	MaxPortProbeTimeout = 10 * time.Second // longer TimeoutMS values are cut to this
)

// ProcOutputLimit is how many bytes of output the agent buffers per process
// of its table. While the process is attached, a full buffer stops the
// agent reading the process's pipes (backpressure); while it is detached,
// the oldest buffered bytes are dropped instead and counted in
// ProcInfo.DroppedBytes.
const ProcOutputLimit = 1 << 20

// ProcMaxExited is how many exited processes the table keeps; beyond it the
// oldest exited entries are forgotten, with any output not yet delivered.
const ProcMaxExited = 128

// Request is the first frame of every stream.
type Request struct {
	Op   Op              `json:"op"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Error is the payload of a TypeError frame. Code is an errkind name.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Health is the result of OpHealth.
type Health struct {
	AgentVersion string `json:"agent_version"`
	Protocol     int    `json:"protocol"`
	UptimeMS     int64  `json:"uptime_ms"`
	BootID       string `json:"boot_id,omitempty"`
	Hostname     string `json:"hostname,omitempty"`
	// Usage is what the guest uses now, as its kernel counts it; nil
	// from an agent that predates it or could not read it. The worker's
	// heartbeat keeps these as the sandbox's usage history.
	Usage *GuestUsage `json:"usage,omitempty"`
}

// GuestUsage is a reading of the guest's own counters. CPU and network
// figures are cumulative since the guest booted (the reader takes the
// difference of two readings); the others are levels.
type GuestUsage struct {
	CPUs int `json:"cpus"` // online CPUs
	// CPUBusy and CPUTotal are clock ticks summed over every CPU from
	// /proc/stat: busy is every kind of time but idle and iowait.
	CPUBusy  uint64 `json:"cpu_busy"`
	CPUTotal uint64 `json:"cpu_total"`
	// Memory in bytes, from /proc/meminfo: used is MemTotal less
	// MemAvailable; cache is Cached.
	MemTotal uint64 `json:"mem_total"`
	MemUsed  uint64 `json:"mem_used"`
	MemCache uint64 `json:"mem_cache"`
	// The root file system in bytes (statfs of /): used is what is not
	// free.
	DiskTotal uint64 `json:"disk_total"`
	DiskUsed  uint64 `json:"disk_used"`
	// Bytes received and sent by every interface but loopback
	// (/proc/net/dev).
	NetRx uint64 `json:"net_rx"`
	NetTx uint64 `json:"net_tx"`
}

// ExecRequest starts a process. Exactly one of Argv and Shell is set.
type ExecRequest struct {
	Argv      []string `json:"argv,omitempty"`
	Shell     string   `json:"shell,omitempty"` // run by /bin/sh -c
	Env       []string `json:"env,omitempty"`   // KEY=VALUE, over the agent's default environment
	Cwd       string   `json:"cwd,omitempty"`   // "" = "/"
	UID       *uint32  `json:"uid,omitempty"`   // nil = 0
	GID       *uint32  `json:"gid,omitempty"`   // nil = the UID's group (= UID)
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	Stdin     bool     `json:"stdin,omitempty"` // host streams stdin; otherwise /dev/null
	PTY       *WinSize `json:"pty,omitempty"`   // run on a new terminal of this size
	// Unlisted drops the process from the process table as soon as it
	// exits, for the host's own commands (warming a restored guest up).
	Unlisted bool `json:"unlisted,omitempty"`
}

// WinSize is a terminal size.
type WinSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Started is sent once the process runs.
type Started struct {
	PID int `json:"pid"`
}

// Signal asks the agent to signal the process group of an exec.
type Signal struct {
	Signal int `json:"signal"`
}

// Exit ends an exec. Code follows the shell's convention: 128+n when the
// process was killed by signal n.
type Exit struct {
	Code     int  `json:"code"`
	Signal   int  `json:"signal,omitempty"`
	TimedOut bool `json:"timed_out,omitempty"`
}

// ProcStart starts a process in the agent's process table. The
// ExecRequest fields are flattened into the same JSON object.
type ProcStart struct {
	ExecRequest
	// KillOnDetach kills the process group (SIGKILL) when its attachment
	// ends because the host closed the stream or went away: the lifetime of
	// OpExec. A takeover by a new attachment is not a detach, and a process
	// that was never attached is not killed.
	KillOnDetach bool `json:"kill_on_detach,omitempty"`
	// Attach attaches the same stream right away, before the process can
	// write anything: the reply goes on as OpProcAttach.
	Attach bool `json:"attach,omitempty"`
	// Tag is a name the caller gives the process, kept in the table and
	// returned in ProcInfo: at most MaxProcTag bytes of UTF-8 without
	// control characters. Tags need not be unique. Agents older than this
	// field ignore it and return no tag.
	Tag string `json:"tag,omitempty"`
}

// ProcRef names a process of the agent's table.
type ProcRef struct {
	ID int64 `json:"id"`
	// Share (proc.attach) joins a live attachment rather than taking over
	// from it; without one the stream attaches as usual. Agents older than
	// this field ignore it and take over.
	Share bool `json:"share,omitempty"`
}

// ProcSignal signals the process group of a process of the agent's table.
// It does nothing once the process has exited.
type ProcSignal struct {
	ID     int64 `json:"id"`
	Signal int   `json:"signal"` // 1..64
}

// ProcInfo describes a process of the agent's table.
type ProcInfo struct {
	// ID is assigned by the agent, counting from 1; it is never reused
	// within a boot. It is not the pid.
	ID            int64    `json:"id"`
	PID           int      `json:"pid"`
	Argv          []string `json:"argv,omitempty"`  // as requested, or
	Shell         string   `json:"shell,omitempty"` // as requested
	Cwd           string   `json:"cwd"`
	PTY           bool     `json:"pty,omitempty"`
	Tag           string   `json:"tag,omitempty"` // as started
	StartedUnixMS int64    `json:"started_unix_ms"`
	// Running is false once the process exited and its output ended (the
	// pipes reached EOF, or stayed quiet for the exit grace); Exit is set
	// then.
	Running  bool  `json:"running"`
	Exit     *Exit `json:"exit,omitempty"`
	Attached bool  `json:"attached"`
	// DroppedBytes counts output discarded because the buffer was full
	// while nobody was attached; BufferedBytes is output buffered and not
	// yet delivered.
	DroppedBytes  int64 `json:"dropped_bytes"`
	BufferedBytes int64 `json:"buffered_bytes"`
}

// ProcList is one batch of an OpProcList reply.
type ProcList struct {
	Processes []ProcInfo `json:"processes"`
}

// PortProbe asks whether a guest TCP port accepts connections.
type PortProbe struct {
	Port int `json:"port"` // 1..65535
	// TimeoutMS bounds each connect; 0 = PortProbeTimeout, at most
	// MaxPortProbeTimeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// PortState is the result of OpPortProbe. Open is true when a connect to
// 127.0.0.1 or to ::1 succeeded within the timeout.
type PortState struct {
	Port int  `json:"port"`
	Open bool `json:"open"`
}

// PathArgs names one guest path.
type PathArgs struct {
	Path string `json:"path"`
	// Settle, for OpFileStat, waits until in-place writes to Path under
	// way (WriteArgs.At), including ones whose host went away while its
	// bytes were in flight, have ended: the size is then where a resumed
	// upload goes on. Agents older than in-place writes refuse it.
	Settle bool `json:"settle,omitempty"`
	// Pages, for OpTarRead: as ReadArgs.Pages, for the content of the
	// archive's larger files.
	Pages bool `json:"pages,omitempty"`
}

// ReadArgs names a file and the part of it to read. Offset and Length
// came after the first agents, which refuse them (invalid_argument).
type ReadArgs struct {
	Path   string `json:"path"`
	Offset int64  `json:"offset,omitempty"` // first byte
	Length int64  `json:"length,omitempty"` // bytes at most; 0 = to the end
	// Pages: the agent may send PagesRef frames in place of data, and the
	// host copies those from guest memory. Set only for an agent that
	// offered it (RingFeatures.PageRefs): older agents refuse the member.
	Pages bool `json:"pages,omitempty"`
}

// WriteArgs describes a file write. The write replaces the file atomically:
// readers see the old or the new content, never a part; with At set it
// appends in place instead (a resumable upload's partial file).
type WriteArgs struct {
	Path     string  `json:"path"`
	Mode     uint32  `json:"mode,omitempty"` // permission bits; 0 = 0644
	UID      *uint32 `json:"uid,omitempty"`
	GID      *uint32 `json:"gid,omitempty"`
	MkdirAll bool    `json:"mkdir_all,omitempty"` // create missing parents (0755)
	// NoSync skips the fsyncs that make the file survive a guest crash,
	// for files the host writes again after every boot and restore.
	NoSync bool `json:"no_sync,omitempty"`
	// At, when set, writes into Path in place starting at byte *At, which
	// must be the file's size (0 creates it, with Mode and owner): each
	// byte that arrives stays, so a cut stream leaves a prefix to resume
	// from. It came after the first agents, which refuse it.
	At *int64 `json:"at,omitempty"`
	// Xattrs are set on the file as user.<key> extended attributes before
	// its bytes arrive (keys as CheckXattr allows). A file system without
	// user extended attributes refuses the write (failed_precondition).
	// It came after the first agents, which refuse it.
	Xattrs map[string]string `json:"xattrs,omitempty"`
}

// Extended attribute limits: what a write may set (WriteArgs.Xattrs) and
// what FileInfo.Xattrs reports of a file's user.* attributes.
const (
	MaxXattrs     = 32      // attributes per file
	MaxXattrKey   = 250     // bytes of a key (the name without "user.")
	MaxXattrValue = 4 << 10 // bytes of a value
)

// CheckXattr reports whether key and value may be a user extended
// attribute of FileInfo.Xattrs and WriteArgs.Xattrs: a key of 1 to
// MaxXattrKey letters, digits, '.', '_' or '-', a value of at most
// MaxXattrValue bytes.
func CheckXattr(key, value string) error {
	if key == "" || len(key) > MaxXattrKey {
		return fmt.Errorf("metadata key of %d bytes, want 1 to %d: %w", len(key), MaxXattrKey, errkind.InvalidArgument)
	}
	for i := 0; i < len(key); i++ {
		b := key[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
			return fmt.Errorf("metadata key %.64q: want letters, digits, '.', '_' or '-': %w", key, errkind.InvalidArgument)
		}
	}
	if len(value) > MaxXattrValue {
		return fmt.Errorf("metadata %s: value of %d bytes, want at most %d: %w", key, len(value), MaxXattrValue, errkind.InvalidArgument)
	}
	return nil
}

// WriteResult is the result of OpFileWrite: the bytes written, and with
// WriteArgs.At the file's size after them.
type WriteResult struct {
	Size    int64 `json:"size"`
	EndSize int64 `json:"end_size,omitempty"`
}

// TarWriteArgs unpacks a tar stream into the directory Path, which is
// created when missing (its parents too with MkdirAll). Entries replace
// what the directory holds under their names; other entries stay.
type TarWriteArgs struct {
	Path     string `json:"path"`
	MkdirAll bool   `json:"mkdir_all,omitempty"`
}

// TarResult counts what a tar stream held.
type TarResult struct {
	Entries int   `json:"entries"`
	Bytes   int64 `json:"bytes"` // regular files' bytes
}

// ListArgs lists a directory.
type ListArgs struct {
	Path  string `json:"path"`
	Limit int    `json:"limit,omitempty"` // 0 = no limit
}

// ListBatch is one batch of directory entries.
type ListBatch struct {
	Entries []FileInfo `json:"entries"`
}

// MkdirArgs creates a directory.
type MkdirArgs struct {
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"` // 0 = 0755
	Parents bool   `json:"parents,omitempty"`
	// UID and GID, when set, own the directories the call makes (not
	// those that were there). Agents before them ignore them.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
}

// RemoveArgs removes a path.
type RemoveArgs struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// RenameArgs renames a path within the guest.
type RenameArgs struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// FileType is the kind of a file. Values are wire format.
type FileType string

// File types.
const (
	FileRegular FileType = "file"
	FileDir     FileType = "dir"
	FileSymlink FileType = "symlink"
	FileOther   FileType = "other"
)

// FileInfo describes one guest file. Name is a single path element.
type FileInfo struct {
	Name    string   `json:"name"`
	Type    FileType `json:"type"`
	Size    int64    `json:"size"`
	Mode    uint32   `json:"mode"` // permission bits plus setuid/setgid/sticky
	UID     uint32   `json:"uid"`
	GID     uint32   `json:"gid"`
	MtimeNS int64    `json:"mtime_ns"`
	Target  string   `json:"target,omitempty"` // symlink target, as stored
	// Owner and Group name UID and GID as the guest's /etc/passwd and
	// /etc/group do; "" when they name none. Agents before them leave
	// them out.
	Owner string `json:"owner,omitempty"`
	Group string `json:"group,omitempty"`
	// Xattrs are the file's user.* extended attributes, without the
	// prefix: at most MaxXattrs of them that CheckXattr allows, by key
	// order; others are left out. Values that are not UTF-8 arrive with
	// U+FFFD in place of their bad bytes. nil when there are none.
	Xattrs map[string]string `json:"xattrs,omitempty"`
}

// WatchArgs watches the directory Path.
type WatchArgs struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
}

// WatchOp is what happened to a watched path. Values are wire format.
type WatchOp string

// Watch ops, after inotify's events: a file or directory made or moved
// in (create), written (write), removed (remove), moved away or renamed
// (rename; its new name, when still watched, comes as a create), its
// mode, owner, times or extended attributes changed (chmod). Overflow
// says events were lost: the guest kernel's queue overflowed, or the
// host read too slowly and the agent's queue of WatchQueue events was
// full; its Path is empty.
const (
	WatchCreate   WatchOp = "create"
	WatchWrite    WatchOp = "write"
	WatchRemove   WatchOp = "remove"
	WatchRename   WatchOp = "rename"
	WatchChmod    WatchOp = "chmod"
	WatchOverflow WatchOp = "overflow"
)

// WatchQueue is how many events the agent holds for a watch whose host
// reads too slowly; beyond it, it drops events and sends WatchOverflow.
const WatchQueue = 4096

// WatchEvent is one change below a watched directory.
type WatchEvent struct {
	Op   WatchOp `json:"op"`
	Path string  `json:"path,omitempty"` // absolute and clean
	// Info describes Path when the agent sent the event, for create,
	// write and chmod events of paths that still exist; else nil.
	Info *FileInfo `json:"info,omitempty"`
}

// WatchBatch is one result frame of an OpFileWatch call.
type WatchBatch struct {
	Events []WatchEvent `json:"events"`
}

// PostRestore is sent by the host after a restore or fork, before any other
// call: the clock, the RNG and (when given) the machine's identity and the
// network are fixed up.
type PostRestore struct {
	UnixNanos int64      `json:"unix_nanos"`
	Entropy   []byte     `json:"entropy"` // 32..4096 bytes of host randomness
	Hostname  string     `json:"hostname,omitempty"`
	Network   *NetConfig `json:"network,omitempty"`
	// MachineID replaces /etc/machine-id (and /var/lib/dbus/machine-id
	// where that is a file of its own): 32 lowercase hex digits, not all
	// zero. "" keeps the guest's. Agents from before it refuse the field.
	MachineID string `json:"machine_id,omitempty"`
	// BootID is what /proc/sys/kernel/random/boot_id shows from now on: a
	// UUID in the kernel's form (36 lowercase characters, 8-4-4-4-12 hex
	// digits). "" keeps the guest's. Agents from before it refuse the
	// field.
	BootID string `json:"boot_id,omitempty"`
}

// NetConfig addresses the guest's network interfaces.
type NetConfig struct {
	Interfaces  []Interface `json:"interfaces"`
	Nameservers []string    `json:"nameservers,omitempty"`
}

// Interface configures one NIC, found by MAC address.
type Interface struct {
	MAC       string   `json:"mac"`
	Addresses []string `json:"addresses"`         // CIDR, e.g. 10.0.0.2/30
	Gateway   string   `json:"gateway,omitempty"` // default route via this address
	// Gateway6 is the IPv6 default route's next hop. IPv6 addresses are
	// added without duplicate address detection (the link is the
	// sandbox's own). Agents from before it refuse the field, which the
	// host takes as "no IPv6".
	Gateway6 string `json:"gateway6,omitempty"`
	MTU      int    `json:"mtu,omitempty"`
}

// Shutdown powers the guest off (or reboots it).
type Shutdown struct {
	Reboot bool `json:"reboot,omitempty"`
}

// Empty is the result of ops that return nothing.
type Empty struct{}

// ErrorFrom maps a Go error to its wire form. errno values from the guest's
// file system map to the kind a caller can act on.
func ErrorFrom(err error) Error {
	kind := errkind.Of(err)
	if kind == errkind.Internal {
		var errno syscall.Errno
		switch {
		case errors.Is(err, fs.ErrNotExist):
			kind = errkind.NotFound
		case errors.Is(err, fs.ErrExist):
			kind = errkind.Conflict
		case errors.Is(err, fs.ErrPermission):
			kind = errkind.PermissionDenied
		case errors.As(err, &errno):
			switch errno {
			case syscall.ENOTDIR, syscall.EISDIR, syscall.ENOTEMPTY, syscall.EBUSY, syscall.EXDEV, syscall.EROFS:
				kind = errkind.FailedPrecondition
			case syscall.ENOSPC, syscall.EDQUOT, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM:
				kind = errkind.ResourceExhausted
			case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP:
				kind = errkind.InvalidArgument
			}
		}
	}
	return Error{Code: kind.String(), Message: err.Error()}
}

// Err turns a wire error back into a Go error that wraps its kind. The message
// came from the guest: callers show it, never act on its text.
func (e Error) Err() error {
	msg := e.Message
	if len(msg) > 1024 {
		msg = msg[:1024] + "..."
	}
	return fmt.Errorf("agent: %q: %w", msg, errkind.Parse(e.Code))
}

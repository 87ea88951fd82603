// Package api holds the wire types of SPACE's public REST API (version 1,
// under /v1). openapi.yaml in this directory describes the same API for
// other languages; a test keeps the two and the server's routes in step.
//
// Field names and string values here are wire format: they change only
// with a new API version.
package api

import (
	"encoding/json"
	"time"
)

// Version is the API version in every path ("/v1/...").
const Version = "v1"

// Error is the body of every failed request: {"error": {...}}.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says what went wrong. Code is one of the ErrorCode values;
// Field names the offending request field of a validation error, if any.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// Error codes, with the HTTP status each is sent with.
const (
	CodeInvalidArgument    = "invalid_argument"    // 400
	CodeUnauthenticated    = "unauthenticated"     // 401
	CodePermissionDenied   = "permission_denied"   // 403
	CodeNotFound           = "not_found"           // 404
	CodeConflict           = "conflict"            // 409
	CodeFailedPrecondition = "failed_precondition" // 409
	CodeTooLarge           = "request_too_large"   // 413
	CodeResourceExhausted  = "resource_exhausted"  // 429 (quota) or 503 (no capacity)
	CodeUnavailable        = "unavailable"         // 503
	CodeDeadlineExceeded   = "deadline_exceeded"   // 504
	CodeInternal           = "internal"            // 500
)

// Health is the reply of GET /v1/health (no authentication).
type Health struct {
	Status  string `json:"status"` // "ok"
	Version string `json:"version"`
}

// SetTimeout is the body of POST /v1/sandboxes/{id}/timeout.
type SetTimeout struct {
	// TimeoutSeconds is counted from now: with on_timeout delete the
	// sandbox is deleted that long from now (sooner or later than
	// before); with suspend it is the new idle time. A suspended
	// sandbox's clock starts again at its resume.
	TimeoutSeconds int64 `json:"timeout_seconds"`
}

// CreateSandbox is the body of POST /v1/sandboxes. Zero values take the
// server's defaults (see the OpenAPI document).
type CreateSandbox struct {
	Template string `json:"template,omitempty"`
	// Network is the policy of the sandbox's egress gateway: every
	// sandbox has a network interface whose far end is a gateway of its
	// own. nil = allow nothing (change it later with PUT .../network).
	Network *Network `json:"network,omitempty"`
	// Secrets grants the team's secrets by name: the sandbox sees only
	// placeholders, and its gateway adds the values to requests for the
	// hosts each secret is bound to. The server adds each of those hosts
	// to the sandbox's Network.Allow as "host:443" unless a rule allows it
	// on 443 already, so the reply's policy is all the gateway enforces; a
	// later PUT .../network may remove them (the grant then stays, inert
	// for that host: the gateway adds a secret only to connections the
	// policy allows). A sandbox with secrets has a network (one allowing
	// only the secrets' hosts if Network is nil). Change the grants of a
	// running sandbox with PUT .../secrets (SecretGrants).
	Secrets        []string          `json:"secrets,omitempty"`
	VCPUs          int               `json:"vcpus,omitempty"`
	MemoryMiB      int64             `json:"memory_mib,omitempty"`
	DiskMiB        int64             `json:"disk_mib,omitempty"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty"` // 0 = the server's default TTL
	Env            map[string]string `json:"env,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// FromSnapshot starts the sandbox as a copy of a snapshot (ID or
	// name) instead of booting; its resources are the snapshot's.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// ColdBoot boots the VM instead of restoring the template's warm
	// snapshot (VMInfo.StartedBy says which happened).
	ColdBoot bool `json:"cold_boot,omitempty"`
	// OnTimeout is what TimeoutSeconds does: "delete" ("" too; it is a
	// lifetime) or "suspend" (it is an idle time, after which the sandbox
	// is suspended rather than deleted).
	OnTimeout string `json:"on_timeout,omitempty"`
	// Checkpoints is when the platform checkpoints the sandbox on its
	// own; nil takes the server's default policy, and a policy that
	// sets neither Every nor AfterExec takes no checkpoints.
	Checkpoints *CheckpointPolicy `json:"checkpoints,omitempty"`
	// FromCheckpoint starts the sandbox as a copy of a checkpoint (its
	// ID, from GET /v1/sandboxes/{id}/checkpoints): a branch from that
	// point. Give it or FromSnapshot, not both.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
}

// CheckpointPolicy says when a sandbox is checkpointed without being
// asked, and how long its checkpoints are kept. A checkpoint is a live
// snapshot (the guest pauses only while its state is saved) stored
// incrementally: only what changed since the sandbox's previous
// checkpoint is added to storage. Durations are Go durations ("90s",
// "5m", "24h").
type CheckpointPolicy struct {
	// Every takes a checkpoint this long after the last one ("" or "0":
	// none on a schedule). At least 1s.
	Every string `json:"every,omitempty"`
	// AfterExec takes a checkpoint when a command that ran at least
	// MinExec ends (commands run attached: POST .../exec without detach,
	// or the exec WebSocket).
	AfterExec bool `json:"after_exec,omitempty"`
	// MinExec is how long a command must have run for AfterExec; "" is
	// 2s.
	MinExec string `json:"min_exec,omitempty"`
	// Keep is how many checkpoints are kept, newest first; 0 is 20.
	Keep int `json:"keep,omitempty"`
	// KeepFor removes checkpoints older than this ("" or "0": no age
	// limit). The newest checkpoint is never removed by age: it is what
	// the sandbox would be recovered from.
	KeepFor string `json:"keep_for,omitempty"`
}

// CheckpointTriggers are the values of Checkpoint.Trigger.
const (
	CheckpointSchedule = "schedule" // the policy's Every came due
	CheckpointExec     = "exec"     // a command of at least MinExec ended (AfterExec)
	CheckpointManual   = "manual"   // POST /v1/sandboxes/{id}/checkpoints
)

// Checkpoint is one entry of a sandbox's history. Its ID is a snapshot
// ID: GET /v1/snapshots/{id} shows it as a snapshot, restore rolls a
// sandbox back to it, and create starts a branch from it.
type Checkpoint struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	CreatedAt time.Time `json:"created_at"`
	Trigger   string    `json:"trigger"` // schedule, exec or manual
	// Command is the last command that ended before the checkpoint was
	// taken (with AfterExec, the one that triggered it), or "".
	Command string `json:"command,omitempty"`
	// StoredBytes is what the checkpoint added to storage; LogicalBytes
	// is the size of its memory, disk and device state, holes included.
	StoredBytes  int64 `json:"stored_bytes"`
	LogicalBytes int64 `json:"logical_bytes"`
	// ReadBytes is what storing it read (only what changed since the
	// previous checkpoint, on reflink storage).
	ReadBytes int64 `json:"read_bytes,omitempty"`
	// PausedMS is how long the guest was paused while it was taken.
	PausedMS int64 `json:"paused_ms"`
}

// Recovery describes how a sandbox came back after its worker was lost.
type Recovery struct {
	Checkpoint   string    `json:"checkpoint"`    // the checkpoint it was restored from
	CheckpointAt time.Time `json:"checkpoint_at"` // when that checkpoint was taken
	// LostWorkSeconds is the age of the checkpoint when the lost worker
	// was last heard from (LastSeen): at least that much of the work the
	// sandbox did is gone (and whatever it did until the worker died).
	LostWorkSeconds float64   `json:"lost_work_seconds"`
	LostWorker      string    `json:"lost_worker"`
	LastSeen        time.Time `json:"last_seen"`    // the worker's last answer to the leader
	LostAt          time.Time `json:"lost_at"`      // when the worker was declared lost
	RecoveredAt     time.Time `json:"recovered_at"` // when it ran again
}

// CheckpointList is the reply of GET /v1/sandboxes/{id}/checkpoints:
// the sandbox's checkpoints, newest first, and the policy in force.
type CheckpointList struct {
	Checkpoints []Checkpoint     `json:"checkpoints"`
	Policy      CheckpointPolicy `json:"policy"`
}

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID        string            `json:"id"`
	Team      string            `json:"team"`
	Template  string            `json:"template"`
	State     string            `json:"state"`
	Worker    string            `json:"worker,omitempty"`
	VCPUs     int               `json:"vcpus"`
	MemoryMiB int64             `json:"memory_mib"`
	DiskMiB   int64             `json:"disk_mib"`
	Env       map[string]string `json:"env,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Network   *Network          `json:"network,omitempty"` // its egress policy; nil = no network
	Secrets   []string          `json:"secrets,omitempty"` // the secrets granted to it (names)
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
	ExpiresAt *time.Time        `json:"expires_at,omitempty"`
	OnTimeout string            `json:"on_timeout,omitempty"` // what its timeout does: delete or suspend
	// VM describes the running VM; absent until the sandbox first ran
	// and while it is suspended.
	VM *VMInfo `json:"vm,omitempty"`
	// SuspendedSnapshot is the snapshot a suspended sandbox (state
	// "suspended") resumes from.
	SuspendedSnapshot string `json:"suspended_snapshot,omitempty"`
	// Checkpoints is the checkpoint policy in force (absent: none).
	Checkpoints *CheckpointPolicy `json:"checkpoints,omitempty"`
	// Reason says why the sandbox is failed or recovering, when the
	// platform knows (e.g. its worker was lost and it had no checkpoint).
	Reason string `json:"reason,omitempty"`
	// RecoveredFrom is set once a sandbox whose worker was lost runs
	// again on another, from its latest checkpoint.
	RecoveredFrom *Recovery `json:"recovered_from,omitempty"`
	// DataPlane is where the sandbox's data-plane requests (exec,
	// processes, files, ports) go while its VM runs; absent otherwise.
	DataPlane *DataPlane `json:"data_plane,omitempty"`
	// Agent is the state of the guest agent of a running sandbox, as its
	// worker's heartbeat last saw it: AgentOK, or AgentUnresponsive once
	// it stopped answering (its data-plane calls then fail with 503
	// unavailable until it answers again). Only GET of one sandbox
	// fills it, while the sandbox runs and its worker answers.
	Agent string `json:"agent,omitempty"`
}

// Sandbox.Agent values.
const (
	AgentOK           = "ok"
	AgentUnresponsive = "unresponsive"
)

// DataPlane names where a sandbox's data-plane requests go and the token
// that authorizes them: the same paths as on the API server
// (/v1/sandboxes/{id}/exec, ...), sent to URL with "Authorization: Bearer
// <Token>" instead of an API key. The token opens only this sandbox and
// only until ExpiresAt (a stream that started before goes on); get the
// sandbox again for a new one.
type DataPlane struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// VMInfo is how a sandbox's VM was started and runs.
type VMInfo struct {
	VMM        string `json:"vmm"`         // "qemu", "firecracker" or "fake" (the test driver)
	VMMVersion string `json:"vmm_version"` // e.g. "7.2.22"
	Accel      string `json:"accel"`       // "kvm" or "tcg"; "none" for the fake
	StartedBy  string `json:"started_by"`  // "boot", "warm" (the template's warm snapshot) or "restore" (a snapshot)
	BootMS     int64  `json:"boot_ms"`     // VMM start until the agent answered
	PID        int    `json:"pid,omitempty"`
	// PSSMiB is the memory the VMM process held when last measured
	// (proportional set size: shared pages counted in part); it is what
	// the sandbox counts against its worker's memory, plus headroom.
	PSSMiB int64 `json:"pss_mib,omitempty"`
}

// SandboxList is the reply of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// Exec is the body of POST /v1/sandboxes/{id}/exec and the first message
// of an exec WebSocket. Exactly one of Command and Shell is set.
type Exec struct {
	Command []string          `json:"command,omitempty"` // argv
	Shell   string            `json:"shell,omitempty"`   // run by /bin/sh -c
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	// User is a user name known in the guest or a numeric uid; "" = root.
	User           string `json:"user,omitempty"`
	TimeoutSeconds int64  `json:"timeout_seconds,omitempty"` // 0 = none
	// Stdin is written to the command's stdin, which is then closed
	// (streaming responses only; a WebSocket streams stdin instead).
	Stdin []byte `json:"stdin,omitempty"`
	// Detach starts the command and returns its Process at once; read its
	// output later with the attach routes.
	Detach bool `json:"detach,omitempty"`
	// KillOnDisconnect kills the command when the client that started it
	// goes away. By default a command outlives its client; its output is
	// kept (up to OutputBufferBytes) until someone attaches.
	KillOnDisconnect bool `json:"kill_on_disconnect,omitempty"`
	// TTY runs the command on a terminal of this size (WebSocket only).
	TTY *WinSize `json:"tty,omitempty"`
	// Tag names the command for whoever looks for it later: it is kept
	// with the Process. At most 256 bytes of UTF-8 without control
	// characters; tags need not be unique.
	Tag string `json:"tag,omitempty"`
}

// MaxStdinWrite bounds the body of POST
// /v1/sandboxes/{id}/processes/{pid}/stdin.
const MaxStdinWrite = 1 << 20

// OutputBufferBytes is how much output a command that nobody is attached
// to keeps; beyond it the oldest bytes are dropped (Process.DroppedBytes).
const OutputBufferBytes = 1 << 20

// WinSize is a terminal size.
type WinSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Process is a command started in a sandbox.
type Process struct {
	ID           int64     `json:"id"`
	PID          int       `json:"pid"`
	Command      []string  `json:"command,omitempty"`
	Shell        string    `json:"shell,omitempty"`
	Cwd          string    `json:"cwd,omitempty"`
	TTY          bool      `json:"tty,omitempty"`
	Tag          string    `json:"tag,omitempty"`
	StartedAt    time.Time `json:"started_at"`
	Running      bool      `json:"running"`
	Exit         *Exit     `json:"exit,omitempty"`
	Attached     bool      `json:"attached"`
	DroppedBytes int64     `json:"dropped_bytes"`
}

// ProcessList is the reply of GET /v1/sandboxes/{id}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// Exit is how a command ended. Code follows the shell's convention:
// 128+n when killed by signal n.
type Exit struct {
	Code     int  `json:"code"`
	Signal   int  `json:"signal,omitempty"`
	TimedOut bool `json:"timed_out,omitempty"`
}

// Event is one line of an exec or attach stream (Content-Type
// application/x-ndjson), or one text message on a WebSocket.
type Event struct {
	Type EventType `json:"type"`
	// Data holds the raw bytes of stdout and stderr events (base64 in
	// JSON, so any byte survives).
	Data    []byte     `json:"data,omitempty"`
	Process *Process   `json:"process,omitempty"` // started
	Exit    *Exit      `json:"exit,omitempty"`    // exit
	Error   *ErrorBody `json:"error,omitempty"`   // error
}

// EventType names an Event.
type EventType string

// Event types. A stream is: started, then stdout/stderr in the order the
// command wrote them, then exactly one of exit or error.
const (
	EventStarted EventType = "started"
	EventStdout  EventType = "stdout"
	EventStderr  EventType = "stderr"
	EventExit    EventType = "exit"
	EventError   EventType = "error"
)

// WebSocket protocol for /exec/ws and /processes/{pid}/attach: binary
// messages carry stream bytes, prefixed by one byte naming the stream
// (StreamStdin from the client; StreamStdout, StreamStderr from the
// server). Text messages are JSON: Control from the client, Event from the
// server. On /exec/ws the client's first message is an Exec.
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
)

// Control is a text message from a WebSocket client.
type Control struct {
	Type   ControlType `json:"type"`
	Rows   uint16      `json:"rows,omitempty"`   // resize
	Cols   uint16      `json:"cols,omitempty"`   // resize
	Signal int         `json:"signal,omitempty"` // signal
}

// ControlType names a Control.
type ControlType string

// Control types.
const (
	ControlStdinEOF ControlType = "stdin_eof"
	ControlResize   ControlType = "resize"
	ControlSignal   ControlType = "signal"
	ControlDetach   ControlType = "detach" // end the attachment, leave the command running
)

// Signal is the body of POST /v1/sandboxes/{id}/processes/{pid}/signal.
type Signal struct {
	Signal int `json:"signal"`
}

// FileInfo describes a file in a sandbox. A symlink is described
// itself, not what it points to.
type FileInfo struct {
	Name string `json:"name"`
	Path string `json:"path"` // absolute
	Type string `json:"type"` // "file", "dir", "symlink", "other"
	Size int64  `json:"size"`
	Mode uint32 `json:"mode"` // permission bits, with setuid, setgid and sticky
	// Permissions are the type and Mode as ls -l shows them: "-rwxr-xr-x".
	Permissions string `json:"permissions"`
	// Owner and Group are the names of UID and GID in the sandbox
	// (/etc/passwd, /etc/group), or the IDs in decimal when they have none.
	Owner   string    `json:"owner"`
	Group   string    `json:"group"`
	UID     uint32    `json:"uid"`
	GID     uint32    `json:"gid"`
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"` // of a symlink, as stored
	// Metadata are the file's user.* extended attributes, without the
	// prefix (X-Space-Metadata-* headers of PUT /files set them); nil
	// when it has none.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// MetadataHeader prefixes the headers of PUT /v1/sandboxes/{id}/files
// that set the file's metadata: X-Space-Metadata-<key>: <value>.
const MetadataHeader = "X-Space-Metadata-"

// MakeDir is the body of POST /v1/sandboxes/{id}/files/mkdir.
type MakeDir struct {
	Path    string `json:"path"`
	Parents *bool  `json:"parents,omitempty"` // create missing parents; nil = true
	// Owner owns the directories the call makes: a user of the sandbox's
	// /etc/passwd (with its group) or a numeric uid; "" = root.
	Owner string `json:"owner,omitempty"`
}

// Move is the body of POST /v1/sandboxes/{id}/files/move.
type Move struct {
	From string `json:"from"`
	To   string `json:"to"` // its missing parents are created
}

// FileEvent is one line of GET /v1/sandboxes/{id}/files/watch.
type FileEvent struct {
	Type FileEventType `json:"type"`
	Path string        `json:"path,omitempty"` // absolute; start and changes
	// Name is Path relative to the watched directory ("." for the
	// directory itself); changes only.
	Name string `json:"name,omitempty"`
	// Entry describes Path as it was when the event was sent, for
	// create, write and chmod events of paths that still exist.
	Entry *FileInfo  `json:"entry,omitempty"`
	Error *ErrorBody `json:"error,omitempty"` // error
}

// FileEventType names a FileEvent. Values are wire format.
type FileEventType string

// File event types. Start comes first, once the directory is watched:
// every change after it is reported. Overflow says events were lost (the
// sandbox's kernel queue, or the watch's own queue while the client read
// too slowly). Error ends the stream; so does the watched directory's own
// remove or rename event.
const (
	FileEventStart    FileEventType = "start"
	FileEventCreate   FileEventType = "create"
	FileEventWrite    FileEventType = "write"
	FileEventRemove   FileEventType = "remove"
	FileEventRename   FileEventType = "rename"
	FileEventChmod    FileEventType = "chmod"
	FileEventOverflow FileEventType = "overflow"
	FileEventError    FileEventType = "error"
)

// FileList is the reply of GET /v1/sandboxes/{id}/files/list.
type FileList struct {
	Path    string     `json:"path"`
	Entries []FileInfo `json:"entries"`
}

// FileWritten is the reply of PUT /v1/sandboxes/{id}/files.
type FileWritten struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// FileUpload is the state of a resumable upload (PUT
// /v1/sandboxes/{id}/files with upload and offset): the bytes the
// sandbox holds so far, and whether the file is in place.
type FileUpload struct {
	Path     string `json:"path"`
	Upload   string `json:"upload"`
	Offset   int64  `json:"offset"`
	Complete bool   `json:"complete"`
}

// TarWritten is the reply of PUT /v1/sandboxes/{id}/files/tar.
type TarWritten struct {
	Path    string `json:"path"`
	Entries int    `json:"entries"`
	Bytes   int64  `json:"bytes"` // regular files' bytes
}

// PortState is the reply of GET /v1/sandboxes/{id}/ports/{port}: whether
// something in the sandbox accepts TCP connections on the port of its
// loopback (127.0.0.1 or ::1).
type PortState struct {
	Port int  `json:"port"`
	Open bool `json:"open"`
}

// CreateAPIKey is the body of POST /v1/apikeys. Team "" is the caller's
// team; another team (created when missing) needs an admin key.
type CreateAPIKey struct {
	Name  string `json:"name,omitempty"`
	Team  string `json:"team,omitempty"`
	Admin bool   `json:"admin,omitempty"` // needs an admin key
}

// APIKey describes a key. Secret is set only in the reply that created it.
type APIKey struct {
	ID        string    `json:"id"`
	Team      string    `json:"team"`
	Name      string    `json:"name,omitempty"`
	Admin     bool      `json:"admin"`
	CreatedAt time.Time `json:"created_at"`
	Secret    string    `json:"secret,omitempty"`
}

// APIKeyList is the reply of GET /v1/apikeys.
type APIKeyList struct {
	Keys []APIKey `json:"keys"`
}

// Quota is a team's limits (0 = unlimited) and what it uses.
type Quota struct {
	Sandboxes   int   `json:"sandboxes"`
	VCPUs       int   `json:"vcpus"`
	MemoryMiB   int64 `json:"memory_mib"`
	SnapshotMiB int64 `json:"snapshot_mib"`
}

// QuotaUsage is the reply of GET /v1/quota: the team's limits and what it
// uses now.
type QuotaUsage struct {
	Limits Quota `json:"limits"`
	Used   Quota `json:"used"`
}

// RegisterWorker is the body of POST /v1/workers, which a standalone
// worker sends (with the cluster's worker token) to join and then as its
// heartbeat.
type RegisterWorker struct {
	ID        string `json:"id"`
	Address   string `json:"address"` // where the control plane reaches the worker's API
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int64  `json:"memory_mib"`
	// Protocol is the worker protocol version the worker speaks. A
	// control plane refuses a worker whose version it does not speak
	// (409, failed_precondition); 0 (absent) is a worker from before
	// versions.
	Protocol     int                `json:"protocol"`
	Capabilities WorkerCapabilities `json:"capabilities"`
}

// WorkerCapabilities is what a worker's host and VMM can do.
type WorkerCapabilities struct {
	VMM        string `json:"vmm"`                   // "qemu", "firecracker" or "fake" (the test driver); "" = not said
	VMMVersion string `json:"vmm_version,omitempty"` // e.g. "7.2.19"
	Accel      string `json:"accel,omitempty"`       // "kvm" or "tcg" (software emulation); "none" for the fake
	// Snapshots: live snapshots and restores; DiffSnapshots: a snapshot
	// writes only the memory dirtied since the previous one.
	Snapshots     bool `json:"snapshots"`
	DiffSnapshots bool `json:"diff_snapshots"`
	// NICs are the kinds of guest NIC the worker gives sandboxes:
	// "socket" (userspace network stack on the VMM's socket), "tap".
	NICs []string `json:"nics"`
	// ChunkedSnapshots: snapshots go to a chunk store that the store's
	// other workers restore from too.
	ChunkedSnapshots bool `json:"chunked_snapshots"`
	// ChunkStore names the chunk store its snapshots go to:
	// "s3://BUCKET/PREFIX?endpoint=HOST" (workers that name the same one
	// share it and can recover each other's sandboxes), "local" (its own
	// disk), or "".
	ChunkStore string `json:"chunk_store,omitempty"`
	// Fencing: it takes the leader's lease, so its sandboxes are
	// recovered elsewhere if it is lost (docs/recovery.md).
	Fencing bool `json:"fencing,omitempty"`
}

// Worker is a worker as GET /v1/workers (admin) shows it.
type Worker struct {
	ID            string `json:"id"`
	Address       string `json:"address"`
	VCPUs         int    `json:"vcpus"`
	MemoryMiB     int64  `json:"memory_mib"`
	UsedVCPUs     int    `json:"used_vcpus"`
	UsedMemoryMiB int64  `json:"used_memory_mib"`
	Sandboxes     int    `json:"sandboxes"`
	// DiskMiB is the largest disk the worker could ever give a sandbox
	// (its storage less its reserve); FreeDiskMiB is the largest it
	// gives a new one now (free space less what its sandboxes may still
	// write and less the reserve). 0 while unknown.
	DiskMiB       int64     `json:"disk_mib,omitempty"`
	FreeDiskMiB   int64     `json:"free_disk_mib,omitempty"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	Healthy       bool      `json:"healthy"`
	// Protocol is the worker protocol version the worker speaks, 0 while
	// unknown (a worker not reached since the control plane started).
	Protocol int `json:"protocol,omitempty"`
	// Capabilities are the worker's, or nil while unknown.
	Capabilities *WorkerCapabilities `json:"capabilities,omitempty"`
}

// WorkerList is the reply of GET /v1/workers.
type WorkerList struct {
	Workers []Worker `json:"workers"`
}

// CreateSnapshot is the body of POST /v1/sandboxes/{id}/snapshots.
type CreateSnapshot struct {
	// Name is optional; unique in the team; 1-128 of [A-Za-z0-9_.-].
	Name string `json:"name,omitempty"`
}

// Snapshot is a checkpoint of a sandbox: memory, processes and files at
// one instant.
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	Team      string    `json:"team"`
	SandboxID string    `json:"sandbox_id"`
	State     string    `json:"state"` // "creating", "ready", "deleting"
	Worker    string    `json:"worker,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// LogicalBytes is the size of memory, disk and device state, holes
	// included; NewBytes is what this snapshot added to storage.
	LogicalBytes int64 `json:"logical_bytes"`
	NewBytes     int64 `json:"new_bytes"`
	// PausedMS is how long the sandbox was paused while it was taken.
	PausedMS int64 `json:"paused_ms"`
	// ReadBytes is what was read to store it in the chunk store: on
	// reflink storage, after an earlier stored snapshot of the same
	// sandbox, only what changed since (its dirty log).
	ReadBytes int64 `json:"read_bytes,omitempty"`
	// VMM and VMMVersion name the VMM that took it ("qemu", "7.2.19"):
	// sandboxes start from it only on workers that run the same. Absent
	// from snapshots taken before they were recorded, which start on any.
	VMM        string `json:"vmm,omitempty"`
	VMMVersion string `json:"vmm_version,omitempty"`
	// Checkpoint is the trigger of a checkpoint (see Checkpoint), "" for
	// a snapshot someone asked for by name or POST .../snapshots.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// SnapshotList is the reply of GET /v1/snapshots. Checkpoints are not
// in it (GET /v1/sandboxes/{id}/checkpoints lists a sandbox's).
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// RestoreSandbox is the body of POST /v1/sandboxes/{id}/restore.
type RestoreSandbox struct {
	Snapshot string `json:"snapshot,omitempty"` // ID or name
	// Checkpoint is a checkpoint's ID (GET .../checkpoints): give it or
	// Snapshot, not both.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// ForkSandbox is the body of POST /v1/sandboxes/{id}/fork.
type ForkSandbox struct {
	Count int `json:"count"` // 1..16
}

// Template is one version of a template, or the built-in default.
type Template struct {
	Name    string `json:"name"`
	Version int    `json:"version,omitempty"` // 0 for the built-in default
	// State is building, ready, failed or deleting (the default: ready).
	State string `json:"state"`
	// Default marks the template sandboxes get when they name none.
	Default   bool              `json:"default,omitempty"`
	Image     string            `json:"image,omitempty"`    // the base image workers boot
	Snapshot  string            `json:"snapshot,omitempty"` // the warm snapshot sandboxes restore
	VCPUs     int               `json:"vcpus,omitempty"`
	MemoryMiB int64             `json:"memory_mib,omitempty"`
	DiskMiB   int64             `json:"disk_mib,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Workdir   string            `json:"workdir,omitempty"`
	User      string            `json:"user,omitempty"`
	// Start is the command left running in the template (argv, or a shell
	// command line as ["/bin/sh", "-c", line]).
	Start     []string     `json:"start,omitempty"`
	Report    *BuildReport `json:"report,omitempty"`
	Error     string       `json:"error,omitempty"` // why its build failed
	CreatedAt time.Time    `json:"created_at"`
}

// TemplateList is the reply of GET /v1/templates and
// GET /v1/templates/{name}.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// BuildReport says what a template build did.
type BuildReport struct {
	Steps    int `json:"steps"`    // steps in the spec
	Executed int `json:"executed"` // steps run in the build sandbox
	Cached   int `json:"cached"`   // steps taken from the build cache
	// VMStarted says a build sandbox ran: "" (none: everything was
	// cached), "boot" (from the base image) or "restore" (from a cached
	// step).
	VMStarted  string `json:"vm_started,omitempty"`
	Snapshots  int    `json:"snapshots"` // snapshots the build took
	DurationMS int64  `json:"duration_ms"`
	// FailedStep is the 1-based step that failed, or 0.
	FailedStep int `json:"failed_step,omitempty"`
	// ExitCode is the failed run step's exit code.
	ExitCode *int `json:"exit_code,omitempty"`
}

// BuildEvent is one line of the NDJSON stream that POST /v1/templates
// answers with. Type is:
//   - "step": step Step of Steps starts (Text describes it);
//   - "cached": step Step is taken from the build cache;
//   - "output": Data is output of the running step on Stream;
//   - "phase": Text names what the build does now (base image, start
//     command, readiness, capture);
//   - "done": the last line of a build that succeeded: Template;
//   - "error": the last line of one that failed: Error, and Report.
type BuildEvent struct {
	Type     string       `json:"type"`
	Step     int          `json:"step,omitempty"`
	Steps    int          `json:"steps,omitempty"`
	Text     string       `json:"text,omitempty"`
	Stream   string       `json:"stream,omitempty"`
	Data     []byte       `json:"data,omitempty"`
	Template *Template    `json:"template,omitempty"`
	Report   *BuildReport `json:"report,omitempty"`
	Error    *ErrorBody   `json:"error,omitempty"`
}

// Network is a sandbox's egress policy. Every sandbox has a network
// interface whose far end is a gateway of its own; every connection and
// DNS query goes through it and is decided by name. Only sandboxes
// restored from snapshots taken before every sandbox had an interface
// have none (null here).
type Network struct {
	// Allow are rules: "host", "*.suffix", an IPv4 address or CIDR, or an
	// IPv6 address or CIDR ("[2001:db8::7]:443" with a port), each with an
	// optional ":port". Names resolve to IPv4 only. Empty allows nothing.
	// HTTP(S) to a name is decided request by request (the gateway
	// terminates TLS with the sandbox's CA); a host rule ending in
	// " tls=passthrough" leaves TLS opaque, decided by its SNI; other TCP
	// reaches a name only through a rule naming its port.
	Allow []string `json:"allow,omitempty"`
	// Off takes the network away, DNS included.
	Off bool `json:"off,omitempty"`
	// ICMP lets pings (ICMP echo) through to what Allow allows on every
	// port: an allowed name, or an address an address rule covers. No
	// other ICMP leaves.
	ICMP bool `json:"icmp,omitempty"`
	// MaxConnections bounds the connections open at once (0 = 256);
	// BytesPerSecond bounds the throughput of all of them together, each
	// direction (0 = unlimited).
	MaxConnections int   `json:"max_connections,omitempty"`
	BytesPerSecond int64 `json:"bytes_per_second,omitempty"`
}

// EgressEvent is one line of the NDJSON reply of
// GET /v1/sandboxes/{id}/egress: a decision of the sandbox's egress
// gateway. An allowed connection is logged when it closes, with its byte
// counts; repeated refusals, DNS answers and pings are aggregated (see
// Count).
type EgressEvent struct {
	Time    time.Time `json:"time"`
	Allowed bool      `json:"allowed"`
	// Proto is "tcp", "http" (one refused request), "dns", "udp",
	// "icmp", "ipv6", "ip", or "audit" (a note that the log dropped
	// events when it fell behind).
	Proto string `json:"proto"`
	// Name is the host name the decision was about, if any.
	Name string `json:"name,omitempty"`
	// Addr and Port are where the guest sent it (for a name, the address
	// the gateway dialed once allowed; for a DNS answer, the address the
	// guest got).
	Addr     string `json:"addr,omitempty"`
	Port     uint16 `json:"port,omitempty"`
	BytesOut int64  `json:"bytes_out,omitempty"` // guest to upstream
	BytesIn  int64  `json:"bytes_in,omitempty"`  // upstream to guest
	// Reason says why it was refused.
	Reason string `json:"reason,omitempty"`
	// Injected says the gateway added secrets to the connection's
	// requests (their values are never logged).
	Injected bool `json:"secret_injected,omitempty"`
	// Mode is how a TCP connection was served: "https" (TLS terminated
	// by the gateway, every request decided), "http" (every request
	// decided), "tls-passthrough" (TLS left opaque by a rule: decided by
	// its SNI alone), "tcp" (neither, to a name a rule allows on that
	// port) or "ip" (to an address an address rule allows).
	Mode string `json:"mode,omitempty"`
	// Requests is how many HTTP requests a connection carried.
	Requests int64 `json:"requests,omitempty"`
	// Method is a refused HTTP request's method (Proto "http").
	Method string `json:"method,omitempty"`
	// Count is how many events the line stands for; 0 = one. Repeated
	// events (refusals, DNS answers, pings) are aggregated: the first
	// to a destination is a line of its own, and those that follow are
	// counted into one line per destination every few seconds, with
	// Time the last one's, Port 0 when they went to several ports (the
	// Reason says which), and the byte counts summed.
	Count int `json:"count,omitempty"`
}

// CreateSecret is the body of POST /v1/secrets: a credential of the team
// that sandboxes may later be granted. The server keeps it encrypted and
// never returns the value.
type CreateSecret struct {
	// Name is 1-64 characters of [A-Za-z0-9_.-], unique in the team.
	Name string `json:"name"`
	// Value is the credential: 1 byte to 64 KiB (base64 in JSON). Sent in
	// a header (Header set), it may hold no control character other than
	// tab.
	Value []byte `json:"value"`
	// Hosts are the exact host names (lower case, no wildcard, no port)
	// whose requests may carry the value: 1 to 16.
	Hosts []string `json:"hosts"`
	// Header is an HTTP header name the value is sent in, or "" for none.
	Header string `json:"header,omitempty"`
	// Format is the header's value, with "{}" (exactly once) standing for
	// the secret's, e.g. "Bearer {}"; "" = "{}". Only with Header.
	Format string `json:"format,omitempty"`
}

// SecretGrants is the body of PUT /v1/sandboxes/{id}/secrets: the names
// of all the team's secrets the running sandbox is granted from now on
// ([] for none). A grant kept keeps its placeholder; a new one gets a
// placeholder (in new execs' environment and /etc/space/secrets/NAME)
// and, as at create, its hosts in the sandbox's policy as "host:443"
// unless a rule allows them on 443 already; a dropped one loses its file,
// is no longer replaced, and leaves the policy as it is.
type SecretGrants struct {
	Secrets []string `json:"secrets"`
}

// Secret describes a team secret. It never carries the value.
type Secret struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`
	Header    string    `json:"header,omitempty"`
	Format    string    `json:"format,omitempty"` // with Header: "{}" at least
	CreatedAt time.Time `json:"created_at"`
}

// SecretList is the reply of GET /v1/secrets, ordered by name.
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}

// UsageSample is one measurement of what a sandbox uses. The guest's
// figures come from its own kernel (through the agent); VMMPSSBytes is
// measured on the host. A sample older than the finest history is the
// mean (CPU) or last value (the rest) of its minute.
type UsageSample struct {
	Time time.Time `json:"time"`
	CPUs int       `json:"cpus"`
	// CPUUsedPct is the share of the guest's CPUs busy since the sample
	// before, 0 to 100.
	CPUUsedPct    float64 `json:"cpu_used_pct"`
	MemTotalBytes int64   `json:"mem_total_bytes"`
	MemUsedBytes  int64   `json:"mem_used_bytes"`  // total less available
	MemCacheBytes int64   `json:"mem_cache_bytes"` // page cache
	// VMMPSSBytes is the host memory the VMM process holds (its PSS):
	// what the sandbox costs its host.
	VMMPSSBytes    int64 `json:"vmm_pss_bytes"`
	DiskTotalBytes int64 `json:"disk_total_bytes"` // the root file system
	DiskUsedBytes  int64 `json:"disk_used_bytes"`
	// NetRxBytes and NetTxBytes count what the guest received and sent
	// since it booted, loopback left out.
	NetRxBytes int64 `json:"net_rx_bytes"`
	NetTxBytes int64 `json:"net_tx_bytes"`
}

// SandboxMetrics is a sandbox's usage history over a time range.
type SandboxMetrics struct {
	SandboxID string `json:"sandbox_id"`
	// IntervalSeconds is how often the sandbox is sampled.
	IntervalSeconds float64       `json:"interval_seconds"`
	Samples         []UsageSample `json:"samples"`
}

// LifecycleEvent is one lifecycle event of a sandbox, as GET /v1/events and
// GET /v1/sandboxes/{id}/events list it and the follow stream sends it.
// Types are listed in docs/operations.md ("Events").
type LifecycleEvent struct {
	// ID is "evt_" and the cursor.
	ID string `json:"id"`
	// Cursor orders the events: a decimal integer, increasing. Pass the
	// last one seen as after= (or Last-Event-ID) to get what follows.
	Cursor    string    `json:"cursor"`
	Time      time.Time `json:"time"`
	Type      string    `json:"type"`
	SandboxID string    `json:"sandbox_id"`
	Team      string    `json:"team"`
	// State is the state the sandbox reached, PreviousState the one it
	// left; "" for an event that is not a change of state.
	State         string `json:"state"`
	PreviousState string `json:"previous_state"`
	// Actor is who or what caused it: "api_key:<key id>",
	// "policy:timeout", "policy:checkpoints", "leader:<replica>"; ""
	// if unknown.
	Actor string `json:"actor"`
	// RequestID is the request (X-Request-Id) or round of background
	// work it came in.
	RequestID string `json:"request_id"`
	// Reason says why, where there is more to say than the type.
	Reason string `json:"reason"`
	// Data holds details of some types: snapshot_id and trigger
	// (checkpointed), snapshot_id (snapshotted, restored), child_id
	// (forked).
	Data json.RawMessage `json:"data,omitempty"`
}

// LifecycleEventList is the reply of GET /v1/events and
// GET /v1/sandboxes/{id}/events, oldest first. Next is the cursor of
// the last event, or the after= given when there is none: pass it as
// after= to continue.
type LifecycleEventList struct {
	Events []LifecycleEvent `json:"events"`
	Next   string           `json:"next"`
}

// AuditEntry is one entry of the audit log: one API call that changed
// something (any method but GET, HEAD and OPTIONS, and the WebSockets
// that run commands) or whose authentication or authorisation was refused
// (401, 403). It names the route's template and the records the path
// named, never a body, query values or headers. Hashes are hex.
type AuditEntry struct {
	Seq       int64     `json:"seq"` // 1, 2, … in the order appended, without gaps
	Time      time.Time `json:"time"`
	RequestID string    `json:"request_id"`
	KeyID     string    `json:"key_id"`  // "" if unauthenticated
	TeamID    string    `json:"team_id"` // "" if unauthenticated
	Source    string    `json:"source"`  // the client's address
	Method    string    `json:"method"`
	Route     string    `json:"route"` // "/v1/sandboxes/{id}"
	// Targets are the path's values by wildcard name ("id", "sid",
	// "name", "pid", …) and "created" for what a create made.
	Targets map[string]string `json:"targets"`
	Code    int               `json:"code"`    // the HTTP status answered
	Outcome string            `json:"outcome"` // ok, refused (403), failed, unauthenticated (401)
	Prev    string            `json:"prev"`    // the previous entry's hash; "" for the first of the log
	Hash    string            `json:"hash"`    // SHA-256 of prev's bytes and the entry's canonical encoding
}

// AuditAnchor is where the audit log's chain starts: the last entry
// pruned (seq 0 and hash "" if none ever was). The first entry kept has
// seq+1 and prev = hash.
type AuditAnchor struct {
	Seq  int64      `json:"seq"`
	Hash string     `json:"hash"`
	Time *time.Time `json:"time,omitempty"` // the pruned entry's time
}

// AuditList is the reply of GET /v1/audit.
type AuditList struct {
	Entries []AuditEntry `json:"entries"`
	// Next is the cursor of the next page (pass it as after), or 0 if
	// this page is the last.
	Next   int64       `json:"next"`
	Anchor AuditAnchor `json:"anchor"`
}

// AuditExportHead is the first line of GET /v1/audit?format=ndjson; each
// line after it is an AuditEntry, but for an Error line that ends an
// export the server could not finish.
type AuditExportHead struct {
	Anchor AuditAnchor `json:"anchor"`
}

// TeamMetrics is a team's sandboxes over time, the reply of GET
// /v1/metrics.
type TeamMetrics struct {
	Team string `json:"team"`
	// StepSeconds is the time between points.
	StepSeconds float64            `json:"step_seconds"`
	Points      []TeamMetricsPoint `json:"points"`
}

// TeamMetricsPoint is one point of TeamMetrics.
type TeamMetricsPoint struct {
	Time time.Time `json:"time"`
	// Running is how many of the team's sandboxes were running at Time.
	Running int `json:"running"`
	// Started is how many the team created from Time to the next point.
	Started int `json:"started"`
}

package workerproto

import (
	"fmt"
	"slices"
	"time"

	"space/api"
	"space/internal/egress"
	"space/internal/errkind"
	"space/internal/sandbox"
)

// Version is the worker protocol's major version (see the package doc).
const Version = 1

// CheckVersion returns nil if worker workerID, speaking protocol version
// v, is compatible with this package's Version, and otherwise a
// FailedPrecondition error that says which side to upgrade. A version
// of 0 is a worker from before versions, which does not say.
func CheckVersion(workerID string, v int) error {
	switch {
	case v == Version:
		return nil
	case v <= 0:
		return fmt.Errorf("worker %s states no worker protocol version (it predates version 1), this control plane speaks %d: upgrade the worker: %w",
			workerID, Version, errkind.FailedPrecondition)
	case v < Version:
		return fmt.Errorf("worker %s speaks worker protocol %d, this control plane speaks %d: upgrade the worker: %w",
			workerID, v, Version, errkind.FailedPrecondition)
	default:
		return fmt.Errorf("worker %s speaks worker protocol %d, this control plane speaks %d: upgrade the control plane: %w",
			workerID, v, Version, errkind.FailedPrecondition)
	}
}

// PathPrefix starts every route of the worker API.
const PathPrefix = "/worker/v1"

// DataPattern is the ServeMux pattern below which the worker serves a
// sandbox's data plane ({id} is the sandbox): the public API's
// /v1/sandboxes/{id}/<rest> is DataPattern/<rest> on the worker (see
// [DataPath]).
const DataPattern = PathPrefix + "/sandboxes/{id}"

// DataPath is the worker's path of sandbox id's data-plane request
// whose path below /v1/sandboxes/{id} of the public API is rest ("" or
// starting with "/").
func DataPath(id, rest string) string { return PathPrefix + "/sandboxes/" + id + rest }

// EgressLogHeader is the response header of the EgressLog verb that
// names the log (see [Service] EgressLog).
const EgressLogHeader = "Space-Egress-Log"

// Spec is what a sandbox runs with.
type Spec struct {
	Template  string            `json:"template"`
	VCPUs     int               `json:"vcpus"`
	MemoryMiB int64             `json:"memory_mib"`
	DiskMiB   int64             `json:"disk_mib"`
	Env       map[string]string `json:"env,omitempty"`
	// Workdir and User are an exec's working directory and user when it
	// names none ("" = / and root): a template's.
	Workdir string `json:"workdir,omitempty"`
	User    string `json:"user,omitempty"`
	// Network is the policy of the egress gateway behind the sandbox's
	// NIC. A create without one gets the default (nothing allowed). nil
	// only in specs from before every sandbox had a NIC: their snapshots
	// restore without one.
	Network *Network `json:"network,omitempty"`
	// Secrets are granted to the sandbox (they need Network): values
	// come with the create (CreateRequest.SecretValues), never in here.
	Secrets []SecretGrant `json:"secrets,omitempty"`
	// ColdBoot boots the VM even when a warm template could be restored.
	ColdBoot bool `json:"cold_boot,omitempty"`
}

// Network is a sandbox's egress policy. Every sandbox has a NIC whose far
// end is a gateway of its own (package egress), which applies it; the
// zero Network allows nothing.
type Network struct {
	// Allow are egress rules (see egress.ParseRule): host names, *.suffix,
	// IPv4 addresses or ranges, each with an optional ":port". Empty
	// allows nothing (DNS answers NXDOMAIN).
	Allow []string `json:"allow,omitempty"`
	// Off takes the network away, DNS included.
	Off bool `json:"off,omitempty"`
	// ICMP lets pings through to what Allow allows on every port
	// (egress.Policy.ICMP).
	ICMP bool `json:"icmp,omitempty"`
	// MaxConnections and BytesPerSecond are egress.Policy's MaxConns
	// and BytesPerSecond.
	MaxConnections int   `json:"max_connections,omitempty"`
	BytesPerSecond int64 `json:"bytes_per_second,omitempty"`
}

// maxRules bounds Network.Allow.
const maxRules = 256

// Policy checks n and returns its egress policy. Errors are
// InvalidArgument.
func (n *Network) Policy() (egress.Policy, error) {
	if len(n.Allow) > maxRules {
		return egress.Policy{}, fmt.Errorf("network: more than %d rules: %w", maxRules, errkind.InvalidArgument)
	}
	rules, err := egress.ParseRules(n.Allow)
	if err != nil {
		return egress.Policy{}, fmt.Errorf("network: %w", err)
	}
	if n.MaxConnections < 0 || n.MaxConnections > 65536 || n.BytesPerSecond < 0 {
		return egress.Policy{}, fmt.Errorf("network: max_connections %d (0..65536) or bytes_per_second %d (>= 0) out of range: %w",
			n.MaxConnections, n.BytesPerSecond, errkind.InvalidArgument)
	}
	return egress.Policy{Allow: rules, Off: n.Off, ICMP: n.ICMP, MaxConns: n.MaxConnections, BytesPerSecond: n.BytesPerSecond}, nil
}

// SecretGrant is a secret a sandbox may use. The guest holds only
// Placeholder (in an environment variable and a file); the sandbox's
// gateway puts the value into requests for Hosts.
type SecretGrant struct {
	Name        string   `json:"name"`
	Placeholder string   `json:"placeholder"`
	Hosts       []string `json:"hosts"`
	Header      string   `json:"header,omitempty"`
	Format      string   `json:"format,omitempty"`
}

// Info describes one of the worker's sandboxes.
type Info struct {
	ID    string        `json:"id"`
	Team  string        `json:"team"`
	State sandbox.State `json:"state"`
	Spec  Spec          `json:"spec"`
	VM    *api.VMInfo   `json:"vm,omitempty"`
	// Error says why a sandbox failed, or "".
	Error string `json:"error,omitempty"`
	// LastActive is when a data-plane request to the sandbox last began
	// or ended on this worker, or when the worker took the sandbox on
	// (created, restored or recovered it) if none did since: what an
	// idle timeout counts from. Zero from a worker that predates it.
	LastActive time.Time `json:"last_active,omitzero"`
	// Active counts the data-plane requests in progress (an exec or
	// an attached stream keeps the sandbox in use until it ends).
	Active int `json:"active,omitempty"`
	// LastExec is the last attached command (exec without detach, or the
	// exec WebSocket) that ended on this worker since it took the sandbox
	// on, or nil: what a checkpoint policy's after_exec goes by.
	LastExec *ExecRecord `json:"last_exec,omitempty"`
	// Agent is the state of the guest agent of a running sandbox:
	// AgentOK, or AgentUnresponsive once it stopped answering the
	// worker's heartbeat (its data-plane calls then fail with
	// errkind.Unavailable until it answers again); "" when the sandbox
	// does not run, or from a worker that predates it.
	Agent string `json:"agent,omitempty"`
}

// Info.Agent values: those of api.Sandbox.Agent.
const (
	AgentOK           = api.AgentOK
	AgentUnresponsive = api.AgentUnresponsive
)

// ExecRecord is a command that ran and ended.
type ExecRecord struct {
	// Command is its argv joined by spaces, or its shell string, cut to
	// MaxExecCommand bytes.
	Command string    `json:"command"`
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
}

// MaxExecCommand bounds ExecRecord.Command.
const MaxExecCommand = 256

// Status is the worker's protocol version, abilities, capacity and use.
type Status struct {
	ID string `json:"id"`
	// Protocol is the worker protocol version the worker speaks
	// (Version); 0 from a worker that predates versions.
	Protocol     int          `json:"protocol"`
	Capabilities Capabilities `json:"capabilities"`

	VCPUs         int   `json:"vcpus"`
	MemoryMiB     int64 `json:"memory_mib"`
	UsedVCPUs     int   `json:"used_vcpus"`
	UsedMemoryMiB int64 `json:"used_memory_mib"`
	Sandboxes     int   `json:"sandboxes"`
	// DiskMiB is the largest disk (disk_mib, plus memory_mib where guest
	// memory files share the storage) the worker could ever give one
	// sandbox: its storage less the reserve it keeps. FreeDiskMiB is the
	// largest it gives a new one now: the storage's free space less what
	// its sandboxes may still write and less the reserve. Both 0 from a
	// worker that predates disk admission (or cannot measure its
	// storage): unknown.
	DiskMiB     int64 `json:"disk_mib,omitempty"`
	FreeDiskMiB int64 `json:"free_disk_mib,omitempty"`
	// Cgroups is "v1", "v2" or "off" (VMMs run without limits).
	Cgroups string `json:"cgroups"`
	// Leased says a lease of the leader's holds now (see LeaseRequest):
	// false from a worker that has taken none, which enforces no fence,
	// as from one whose lease ran out, which serves nothing.
	Leased bool `json:"leased,omitempty"`
}

// NIC kinds of Capabilities.NICs.
const (
	// NICSocket is a NIC whose backend is the worker's userspace network
	// stack on a unix socket of the VMM's (QEMU).
	NICSocket = "socket"
	// NICTap is a tap device in a network namespace of the sandbox's
	// own, the gateway on its host side.
	NICTap = "tap"
)

// Capabilities is what a worker's host and VMM can do. A control plane
// uses it to decide what to ask of the worker; the zero value claims
// nothing.
type Capabilities struct {
	// VMM is the kind of VMM: "qemu", "firecracker" or "fake" (the
	// test driver, package vmm/fake); "" = not said.
	VMM string `json:"vmm"`
	// VMMVersion is the VMM's version ("7.2.19"); "" = not known.
	VMMVersion string `json:"vmm_version,omitempty"`
	// Accel is the accelerator guests run with: "kvm" or "tcg"
	// (software emulation, far slower), or "none" for the fake VMM's
	// guests, which are host processes; "" = not known.
	Accel string `json:"accel,omitempty"`
	// Snapshots says the worker takes live snapshots and restores them.
	Snapshots bool `json:"snapshots"`
	// DiffSnapshots says a snapshot writes only the memory the guest
	// dirtied since the sandbox's previous one.
	DiffSnapshots bool `json:"diff_snapshots"`
	// NICs are the kinds of guest NIC the worker gives sandboxes
	// (NICSocket, NICTap).
	NICs []string `json:"nics"`
	// ChunkedSnapshots says the worker stores snapshots in a chunk store,
	// from which the other workers of that store restore them too.
	ChunkedSnapshots bool `json:"chunked_snapshots"`
	// ChunkStore names the chunk store the worker's snapshots go to:
	// "s3://BUCKET/PREFIX?endpoint=HOST" for an S3 one (workers that name
	// the same share it, and restore each other's snapshots and
	// checkpoints), "local" for a directory of the worker's own, "" for
	// none. Credentials are never in it.
	ChunkStore string `json:"chunk_store,omitempty"`
	// Fencing says the worker takes the leader's lease (the Lease verb):
	// it stops serving and freezes its guests when a lease runs out, and
	// removes what a newer epoch took from it. Only such a worker's
	// sandboxes are recovered elsewhere when it is lost.
	Fencing bool `json:"fencing,omitempty"`
}

// LeaseRequest is the body of the Lease verb. The leader sends it to
// every worker that states Capabilities.Fencing, every few seconds.
//
// A worker that has taken a lease serves its sandboxes only while one
// holds: TTLMS after it received the latest (by its own monotonic clock).
// Once that passes, it freezes its guests and answers data-plane requests
// 503, until a lease comes again. The leader restores a lost worker's
// sandboxes elsewhere only after a longer time without a successful
// Lease call (the recovery delay, at least twice TTLMS), so by then the
// lost worker has stopped them, wherever its clock stands.
//
// Epoch is the worker's fencing epoch as the store records it. The
// leader raises it when it takes the worker's sandboxes away (to recover
// them elsewhere); a worker that then comes back sees an epoch newer
// than the one it knows, and before it answers it stops and removes
// every sandbox it holds that Keep does not list, so it never serves
// them again, and records the new epoch (on disk: a restart does not
// forget it).
type LeaseRequest struct {
	Epoch int64 `json:"epoch"`
	TTLMS int64 `json:"ttl_ms"`
	// Keep lists the sandboxes the store places on the worker.
	Keep []string `json:"keep"`
}

// LeaseReply is the answer of the Lease verb.
type LeaseReply struct {
	Epoch int64 `json:"epoch"` // the worker's epoch now
	// Removed lists the sandboxes the worker stopped and removed because
	// a newer epoch took them away.
	Removed []string `json:"removed,omitempty"`
}

// MaxLeaseTTL bounds LeaseRequest.TTLMS.
const MaxLeaseTTL = 5 * time.Minute

// Validate checks c as a worker reports it: known accelerator, VMM and
// NIC kinds, bounded strings. Errors are InvalidArgument.
func (c Capabilities) Validate() error {
	switch {
	case !slices.Contains([]string{"", "qemu", "firecracker", "fake"}, c.VMM):
		return fmt.Errorf("capabilities: vmm %.32q, want qemu, firecracker or fake: %w", c.VMM, errkind.InvalidArgument)
	case len(c.VMMVersion) > 64:
		return fmt.Errorf("capabilities: vmm_version longer than 64 bytes: %w", errkind.InvalidArgument)
	case c.VMM == "fake" && !slices.Contains([]string{"", "none"}, c.Accel):
		return fmt.Errorf("capabilities: accel %.32q of the fake vmm, want none: %w", c.Accel, errkind.InvalidArgument)
	case c.VMM != "fake" && !slices.Contains([]string{"", "kvm", "tcg"}, c.Accel):
		return fmt.Errorf("capabilities: accel %.32q, want kvm or tcg: %w", c.Accel, errkind.InvalidArgument)
	case len(c.ChunkStore) > 1024:
		return fmt.Errorf("capabilities: chunk_store longer than 1024 bytes: %w", errkind.InvalidArgument)
	case len(c.NICs) > 2:
		return fmt.Errorf("capabilities: %d nic kinds, want at most socket and tap: %w", len(c.NICs), errkind.InvalidArgument)
	}
	for _, k := range c.NICs {
		if k != NICSocket && k != NICTap {
			return fmt.Errorf("capabilities: nic kind %.32q, want socket or tap: %w", k, errkind.InvalidArgument)
		}
	}
	return nil
}

// API returns c as the public API shows it.
func (c Capabilities) API() api.WorkerCapabilities {
	return api.WorkerCapabilities{
		VMM: c.VMM, VMMVersion: c.VMMVersion, Accel: c.Accel, Snapshots: c.Snapshots,
		DiffSnapshots: c.DiffSnapshots, NICs: slices.Clone(c.NICs), ChunkedSnapshots: c.ChunkedSnapshots,
		ChunkStore: c.ChunkStore, Fencing: c.Fencing,
	}
}

// CapabilitiesOf returns the capabilities a worker registered with.
func CapabilitiesOf(a api.WorkerCapabilities) Capabilities {
	return Capabilities{
		VMM: a.VMM, VMMVersion: a.VMMVersion, Accel: a.Accel, Snapshots: a.Snapshots,
		DiffSnapshots: a.DiffSnapshots, NICs: slices.Clone(a.NICs), ChunkedSnapshots: a.ChunkedSnapshots,
		ChunkStore: a.ChunkStore, Fencing: a.Fencing,
	}
}

// CreateRequest is the request of the Create verb.
type CreateRequest struct {
	ID   string `json:"id"`
	Team string `json:"team"`
	// Spec is what the sandbox runs with. With FromSnapshot it is the
	// snapshot's, unless Spec.Template is set: then it must match the
	// snapshot's and gives the exec defaults (see Overrides).
	Spec Spec `json:"spec"`
	// FromSnapshot restores the sandbox from this worker's snapshot
	// instead of booting it; "" boots.
	FromSnapshot string `json:"from_snapshot,omitempty"`
	// TakeSnapshot spends FromSnapshot, a snapshot on this worker's disk
	// only (not chunked), on this sandbox: its memory file and disk move
	// into the sandbox instead of being copied, and the snapshot is gone
	// afterwards, whatever the outcome. For the last child of a fork.
	TakeSnapshot bool `json:"take_snapshot,omitempty"`
	// SecretValues are the values of the secrets Spec grants, by name.
	// The worker keeps them sealed and gives them only to the sandbox's
	// gateway.
	SecretValues map[string][]byte `json:"secret_values,omitempty"`
}

// Overrides is the spec a restore from FromSnapshot gets for the
// request: nil (the snapshot's own) unless Spec.Template is set.
func (req CreateRequest) Overrides() *Spec {
	if req.Spec.Template == "" {
		return nil
	}
	return &req.Spec
}

// SnapshotRequest is the request of the Snapshot verb.
type SnapshotRequest struct {
	SnapshotID string `json:"snapshot_id"`
	// Local keeps a new snapshot on the worker's disk only, out of the
	// chunk store: for one that lives only as long as a fork takes.
	Local bool `json:"local,omitempty"`
	// Ephemeral skips making the snapshot durable: it only has to outlive
	// this worker process, not a host crash (a fork's).
	Ephemeral bool `json:"ephemeral,omitempty"`
}

// RestoreRequest is the request of the Restore verb.
type RestoreRequest struct {
	SnapshotID string `json:"snapshot_id"`
}

// SecretsRequest is the request of the SetSecrets verb: a running
// sandbox's new grants, with the policy that goes with them.
type SecretsRequest struct {
	// Secrets are all the sandbox's grants from now on (none clears
	// them). A grant kept from before keeps its placeholder.
	Secrets []SecretGrant `json:"secrets"`
	// Network is the sandbox's policy with them: the control plane adds
	// the hosts of new grants to it, as at create. The gateway enforces
	// exactly this.
	Network Network `json:"network"`
	// SecretValues are the values of every secret in Secrets, by name.
	SecretValues map[string][]byte `json:"secret_values,omitempty"`
}

// SnapshotInfo describes a snapshot the worker keeps on its disk.
type SnapshotInfo struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Spec      Spec      `json:"spec"` // the sandbox's at the snapshot; a restore gets the same
	Created   time.Time `json:"created"`
	// LogicalBytes is the size of the snapshot's files as the guest sees
	// them (memory, disk and device state, holes included).
	LogicalBytes int64 `json:"logical_bytes"`
	// StoredBytes is the disk space the snapshot's files take on the
	// worker (their data, holes excluded).
	StoredBytes int64 `json:"stored_bytes"`
	// PausedMS is how long the guest was paused for the snapshot.
	PausedMS int64 `json:"paused_ms"`
	// NewBytes is what the snapshot added to the chunk store (0 without
	// one); Chunked says it is there.
	NewBytes int64 `json:"new_bytes,omitempty"`
	Chunked  bool  `json:"chunked,omitempty"`
	// ReadBytes is what storing it in the chunk store read of its files.
	ReadBytes int64 `json:"read_bytes,omitempty"`
}

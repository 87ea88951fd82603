// Package store defines the control plane's durable state: teams, API keys,
// sandboxes, snapshots, templates, the build cache, sealed secrets,
// archived egress logs, sandboxes' lifecycle events, teams' webhooks, the
// audit log, workers and the leases replicas coordinate with, and the
// [Store] contract its backends implement.
//
// Backends live in subpackages (sqlite for the embedded single-host setup,
// postgres for scale-out); both pass the conformance suite in storetest.
// Every write is durable when it returns. Records are plain values: a caller
// owns what it gets back and may modify it freely.
package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"space/internal/errkind"
)

// Sentinel errors. Each wraps an [errkind] kind, so callers can test for
// either the sentinel or the kind with errors.Is.
var (
	// ErrNotFound is returned when a record does not exist or belongs to
	// another team.
	ErrNotFound = fmt.Errorf("not found: %w", errkind.NotFound)
	// ErrAlreadyExists is returned when creating a record whose ID (or API
	// key hash, snapshot name, build cache key or secret name) is taken.
	ErrAlreadyExists = fmt.Errorf("already exists: %w", errkind.Conflict)
	// ErrVersionConflict is returned by UpdateSandbox, UpdateSnapshot and
	// UpdateTemplate when the stored version (Rev for a template) differs
	// from the one the caller read.
	ErrVersionConflict = fmt.Errorf("version conflict: %w", errkind.Conflict)
	// ErrInvalid is returned for malformed input; nothing is written.
	ErrInvalid = fmt.Errorf("invalid argument: %w", errkind.InvalidArgument)
	// ErrLeaseLost is returned by RenewLease and by the writes of
	// [Store.Fenced] when the lease is no longer the caller's: it was
	// released, or it expired and another holder acquired it. It wraps
	// errkind.FailedPrecondition: retrying the same call cannot succeed;
	// the caller must stop the work the lease covered (or acquire the name
	// again, re-read what it works on and start over).
	ErrLeaseLost = fmt.Errorf("lease lost: %w", errkind.FailedPrecondition)
)

// Store is the control plane's state. Implementations are safe for
// concurrent use. The caller must call Close.
type Store interface {
	Teams
	APIKeys
	Sandboxes
	SandboxIndex
	Snapshots
	SnapshotIndex
	Templates
	TemplateIndex
	Secrets
	EgressLogs
	Events
	Webhooks
	Audit
	Workers
	Leases
	Quotas
	// Fenced returns the writes that commit only while l is still held:
	// each one checks, in the same transaction as its write, that the
	// lease l.Name exists with token l.Token and has not expired (by the
	// database's clock), and otherwise returns ErrLeaseLost and writes
	// nothing. A replica that lost its claim (it stalled past the expiry
	// and another took the name over with a higher token) therefore cannot
	// overwrite what the new holder does. The lease need not name the
	// record written: the leader's lease fences every write of the
	// leader's background work.
	Fenced(l Lease) FencedWrites
	// Close releases the store's connections. It is idempotent.
	Close() error
}

// Teams manages teams, the unit of ownership and isolation.
type Teams interface {
	// CreateTeam stores a new team. ErrAlreadyExists if the ID is taken.
	CreateTeam(ctx context.Context, t Team) (Team, error)
	// Team returns the team id, or ErrNotFound.
	Team(ctx context.Context, id string) (Team, error)
	// SetTeamQuota replaces the team's Quota with quota (nil clears it: the
	// server's default applies) and returns the updated team. ErrNotFound if
	// the team does not exist, ErrInvalid if quota fails [ValidateQuota].
	SetTeamQuota(ctx context.Context, id string, quota json.RawMessage) (Team, error)
}

// APIKeys manages API keys. Only the hash of a key's secret is stored.
type APIKeys interface {
	// CreateAPIKey stores a new key. ErrNotFound if its team does not
	// exist, ErrAlreadyExists if its ID or hash is taken.
	CreateAPIKey(ctx context.Context, k APIKey) (APIKey, error)
	// APIKeyByHash returns the key whose secret hashes to hash, or ErrNotFound.
	APIKeyByHash(ctx context.Context, hash [32]byte) (APIKey, error)
	// ListAPIKeys returns the team's keys ordered by creation.
	ListAPIKeys(ctx context.Context, teamID string) ([]APIKey, error)
	// DeleteAPIKey removes one of the team's keys, or returns ErrNotFound.
	DeleteAPIKey(ctx context.Context, teamID, id string) error
}

// Sandboxes manages sandbox records on behalf of one team at a time. A
// sandbox of another team is reported as ErrNotFound. Each write that
// creates a sandbox, changes its State or deletes it also records the
// lifecycle event of that change, in its transaction (see [Events]).
type Sandboxes interface {
	// CreateSandbox stores sb with Version 1 and Created/Updated set to now.
	// ErrNotFound if sb.TeamID does not exist, ErrAlreadyExists if the ID
	// is taken.
	CreateSandbox(ctx context.Context, sb Sandbox) (Sandbox, error)
	// Sandbox returns the team's sandbox id, or ErrNotFound.
	Sandbox(ctx context.Context, teamID, id string) (Sandbox, error)
	// ListSandboxes returns the team's sandboxes that match f, ordered by
	// creation.
	ListSandboxes(ctx context.Context, teamID string, f Filter) ([]Sandbox, error)
	// UpdateSandbox replaces the mutable fields (State, WorkerID, Spec,
	// Handle, Labels, Expires) of sb.TeamID's sandbox sb.ID if its stored
	// version is still sb.Version, and returns the new record with Version
	// incremented and Updated set to now. ErrVersionConflict if the version
	// moved on, ErrNotFound if the sandbox does not exist.
	UpdateSandbox(ctx context.Context, sb Sandbox) (Sandbox, error)
	// DeleteSandbox removes the team's sandbox id, or returns ErrNotFound.
	DeleteSandbox(ctx context.Context, teamID, id string) error
}

// SandboxIndex answers the control plane's cross-team background queries.
type SandboxIndex interface {
	// SandboxesByWorker returns the sandboxes placed on the worker,
	// of every team, ordered by creation.
	SandboxesByWorker(ctx context.Context, workerID string) ([]Sandbox, error)
	// ExpiredSandboxes returns the sandboxes of every team whose Expires is
	// set and not after now, except those already in StateDeleted,
	// earliest expiry first.
	ExpiredSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error)
	// SandboxByID returns sandbox id whatever its team, or ErrNotFound:
	// for a caller that proved its right to the sandbox by other means
	// than a team's key (a token bound to the ID).
	SandboxByID(ctx context.Context, id string) (Sandbox, error)
	// CountSandboxes returns how many sandboxes of every team are in
	// each state; a state no sandbox is in is absent. For metrics: one
	// aggregate query, however many sandboxes there are.
	CountSandboxes(ctx context.Context) (map[SandboxState]int, error)
	// CountSandboxesByTeam is CountSandboxes by team (team ID, then
	// state), deleted tombstones left out: one aggregate query that
	// returns a row per team and state in use.
	CountSandboxesByTeam(ctx context.Context) (map[string]map[SandboxState]int, error)
}

// Snapshots manages snapshot records on behalf of one team at a time. A
// snapshot of another team is reported as ErrNotFound.
type Snapshots interface {
	// CreateSnapshot stores sn with Version 1 and Created/Updated set to
	// now. ErrNotFound if sn.TeamID does not exist, ErrAlreadyExists if the
	// ID is taken or the team has another snapshot with the same non-empty
	// Name. The sandbox sn.SandboxID need not exist.
	CreateSnapshot(ctx context.Context, sn Snapshot) (Snapshot, error)
	// Snapshot returns the team's snapshot id, or ErrNotFound.
	Snapshot(ctx context.Context, teamID, id string) (Snapshot, error)
	// SnapshotByName returns the team's snapshot called name, or
	// ErrNotFound. ErrInvalid if name is empty.
	SnapshotByName(ctx context.Context, teamID, name string) (Snapshot, error)
	// ListSnapshots returns the team's snapshots taken from sandboxID, or
	// all of them if sandboxID is "", ordered by creation. ErrInvalid if
	// sandboxID is neither "" nor a valid sandbox ID.
	ListSnapshots(ctx context.Context, teamID, sandboxID string) ([]Snapshot, error)
	// UpdateSnapshot replaces the mutable fields (State, WorkerID, Manifest,
	// LogicalBytes, NewBytes, Meta) of sn.TeamID's snapshot sn.ID if its
	// stored version is still sn.Version, and returns the new record with
	// Version incremented and Updated set to now. ErrVersionConflict if the
	// version moved on, ErrNotFound if the snapshot does not exist.
	UpdateSnapshot(ctx context.Context, sn Snapshot) (Snapshot, error)
	// DeleteSnapshot removes the team's snapshot id, or returns ErrNotFound.
	DeleteSnapshot(ctx context.Context, teamID, id string) error
	// TeamSnapshotBytes returns the sum of NewBytes over the team's
	// snapshots in every state: 0 if it has none (or does not exist).
	TeamSnapshotBytes(ctx context.Context, teamID string) (int64, error)
}

// SnapshotIndex answers the control plane's cross-team snapshot queries.
type SnapshotIndex interface {
	// AllSnapshotManifests returns every non-empty Manifest of the snapshots
	// of every team, in every state: the chunk store's live set. Each
	// appears once; the order is bytewise ascending.
	AllSnapshotManifests(ctx context.Context) ([]string, error)
	// UnsettledSnapshots returns the snapshots of every team that are
	// being created or deleted, oldest first: what a crash may have left
	// half done.
	UnsettledSnapshots(ctx context.Context) ([]Snapshot, error)
}

// Templates manages template versions and the build cache on behalf of one
// team at a time. A record of another team is reported as ErrNotFound.
//
// A template is named by its team, its name and its version; lookups name
// a version of at least 1 (Template also takes 0: the latest ready one) and
// get ErrInvalid for a malformed name, version, cache key or snapshot ID.
type Templates interface {
	// CreateTemplate stores t as the next version of t.TeamID's template
	// t.Name, with Rev 1 and Created/Updated set to now, and returns it with
	// Version set: one more than the highest version the name ever had,
	// deleted ones included (t.Version is ignored). ErrNotFound if the team
	// does not exist, ErrInvalid if t fails [Template.Validate].
	CreateTemplate(ctx context.Context, t Template) (Template, error)
	// Template returns version of the team's template name; version 0
	// means the highest version that is ready. ErrNotFound if there is
	// none.
	Template(ctx context.Context, teamID, name string, version int) (Template, error)
	// ListTemplates returns the team's versions of template name, or of
	// every template if name is "", ordered bytewise by name, then by
	// version.
	ListTemplates(ctx context.Context, teamID, name string) ([]Template, error)
	// UpdateTemplate replaces the mutable fields (State, Key, SnapshotID,
	// Meta) of version t.Version of t.TeamID's template t.Name if its stored
	// Rev is still t.Rev, and returns the new record with Rev incremented
	// and Updated set to now. ErrVersionConflict if the Rev moved on,
	// ErrNotFound if the version does not exist.
	UpdateTemplate(ctx context.Context, t Template) (Template, error)
	// DeleteTemplate removes one version of the team's template name, or
	// returns ErrNotFound. Its number is not reused.
	DeleteTemplate(ctx context.Context, teamID, name string, version int) error
	// PutBuildCache stores e with Created set to now. ErrAlreadyExists if
	// the team already has an entry for e.Key, ErrNotFound if the team does
	// not exist, ErrInvalid if e fails [BuildCacheEntry.Validate].
	PutBuildCache(ctx context.Context, e BuildCacheEntry) (BuildCacheEntry, error)
	// BuildCache returns the team's entry for key, or ErrNotFound.
	BuildCache(ctx context.Context, teamID, key string) (BuildCacheEntry, error)
	// ListBuildCache returns the team's entries, oldest first.
	ListBuildCache(ctx context.Context, teamID string) ([]BuildCacheEntry, error)
	// DeleteBuildCache removes the team's entry for key, or returns
	// ErrNotFound.
	DeleteBuildCache(ctx context.Context, teamID, key string) error
	// SnapshotInUse reports whether a template version of the team, in
	// any state, or a build cache entry of the team references snapshot
	// snapshotID: whether deleting that snapshot would break them.
	SnapshotInUse(ctx context.Context, teamID, snapshotID string) (bool, error)
}

// TemplateIndex answers the control plane's cross-team template queries.
type TemplateIndex interface {
	// UnsettledTemplates returns the template versions of every team that
	// are building or deleting, oldest first: what a crash may have left
	// half done.
	UnsettledTemplates(ctx context.Context) ([]Template, error)
}

// Secrets manages team secrets on behalf of one team at a time. A secret
// of another team is reported as ErrNotFound; a malformed name is
// ErrInvalid.
type Secrets interface {
	// CreateSecret stores sc with Created/Updated set to now.
	// ErrAlreadyExists if the team has a secret of that name, ErrNotFound
	// if the team does not exist, ErrInvalid if sc fails
	// [Secret.Validate].
	CreateSecret(ctx context.Context, sc Secret) (Secret, error)
	// Secret returns the team's secret name, Sealed included, or
	// ErrNotFound.
	Secret(ctx context.Context, teamID, name string) (Secret, error)
	// ListSecrets returns the team's secrets ordered bytewise by name,
	// without their sealed values (Sealed is nil): what to show, not what
	// to use. Use Secret for the value.
	ListSecrets(ctx context.Context, teamID string) ([]Secret, error)
	// DeleteSecret removes the team's secret name, or returns ErrNotFound.
	DeleteSecret(ctx context.Context, teamID, name string) error
}

// EgressLogs keeps sandboxes' egress audit logs once they leave a worker
// (deleted, suspended, moved): segments, each one worker's whole log of one
// run of the sandbox. Segments outlive the sandbox record.
type EgressLogs interface {
	// PutEgressLog stores seg with Created set to now. A segment of the
	// same team, sandbox and LogID is replaced (its Data; it keeps its
	// Created), so a retry after a crash stores it once. ErrInvalid if seg
	// fails [EgressLog.Validate], ErrNotFound if the team does not exist.
	PutEgressLog(ctx context.Context, seg EgressLog) (EgressLog, error)
	// EgressLogs returns the team's segments of sandbox sandboxID, Data
	// included, oldest Created first (then bytewise by LogID). None is an
	// empty slice, not an error; another team's are never returned.
	EgressLogs(ctx context.Context, teamID, sandboxID string) ([]EgressLog, error)
	// DeleteEgressLogsBefore removes every team's segments created before
	// t and returns how many went.
	DeleteEgressLogsBefore(ctx context.Context, t time.Time) (int, error)
}

// Workers records the hosts that run sandboxes.
type Workers interface {
	// UpsertWorker creates the worker or replaces all its fields.
	UpsertWorker(ctx context.Context, w Worker) error
	// ListWorkers returns all workers ordered by ID.
	ListWorkers(ctx context.Context) ([]Worker, error)
	// DeleteWorker removes the worker id, or returns ErrNotFound. Its
	// sandboxes keep their WorkerID.
	DeleteWorker(ctx context.Context, id string) error
	// RaiseWorkerEpoch sets worker id's Epoch to from+1 if it is from,
	// and returns the new epoch; ErrVersionConflict if it is not from,
	// ErrNotFound if there is no such worker. UpsertWorker never
	// changes an epoch.
	RaiseWorkerEpoch(ctx context.Context, id string, from int64) (int64, error)
}

// Leases coordinate control plane replicas that share one store: a lease
// gives one holder (a replica's ID) a name for a while. Names are claims on
// records ("sandbox/sbx_…", "snapshot/snp_…": this replica works on it,
// others leave it alone) or roles ("leader"). See [Lease].
//
// Expiry is decided by the database's clock (PostgreSQL's now(); SQLite,
// embedded in one process, uses that process's clock), so replicas whose
// clocks disagree still agree on who holds what. Names and holders are
// 1 to 256 bytes of printable ASCII other than space (ErrInvalid
// otherwise); a ttl must be at least a millisecond.
type Leases interface {
	// AcquireLease gives name to holder for ttl. If holder already holds
	// name and the lease has not expired, it is extended to ttl from now
	// and keeps its token. If nobody holds name, or the lease expired, the
	// new lease gets a new token, higher than any the name had. If
	// another holder's lease has not expired, the error wraps
	// errkind.Conflict and says who holds it until when.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error)
	// RenewLease extends l to ttl from now, keeping its token, and returns
	// the updated lease. ErrLeaseLost if l was released or taken over
	// (a lease that expired but that nobody acquired since is renewed).
	RenewLease(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// ReleaseLease ends l if it is still l's holder's with l's token;
	// otherwise (released before, taken over) it does nothing. Its token
	// is never reused.
	ReleaseLease(ctx context.Context, l Lease) error
	// ListLeases returns the leases whose names begin with prefix (all of
	// them for ""), expired ones included (see [Lease.Expired]), ordered
	// bytewise by name.
	ListLeases(ctx context.Context, prefix string) ([]Lease, error)
}

// Quotas create and resume sandboxes within a team's quota and report
// what a team uses. All count the team's live sandboxes: those in a state
// not in [NotLive].
type Quotas interface {
	// CreateSandboxWithinQuota is CreateSandbox that first counts the
	// team's live sandboxes, and the sum of their VCPUs and MemoryMiB, and
	// stores sb only if it fits q (with sb counted, unless sb's own state
	// is not live). The count and the insert are one transaction that
	// serializes with every other CreateSandboxWithinQuota of the same
	// team, in every process sharing the database, so concurrent creates
	// never overshoot q. A refusal is a *[QuotaError] (its Limit says
	// which), wraps errkind.ResourceExhausted and names the limit ("team
	// t quota: 50 of 50 sandboxes in use").
	CreateSandboxWithinQuota(ctx context.Context, sb Sandbox, q Quota) (Sandbox, error)
	// UpdateSandboxWithinQuota is UpdateSandbox (the same compare-and-set
	// on Version, the same errors) that, when it would make a sandbox live
	// again (the stored state is not live and sb's is: a suspended sandbox
	// resumed), first checks that the sandbox fits q beside the team's
	// other live sandboxes, counting the VCPUs and MemoryMiB stored with
	// it. The check and the update are one transaction that serializes with
	// every CreateSandboxWithinQuota and UpdateSandboxWithinQuota of the
	// same team, in every process sharing the database. A refusal wraps
	// errkind.ResourceExhausted, names the limit as
	// CreateSandboxWithinQuota does, and writes nothing. An update that
	// leaves the sandbox live, or not live, is not checked.
	UpdateSandboxWithinQuota(ctx context.Context, sb Sandbox, q Quota) (Sandbox, error)
	// TeamUsage returns what the team's live sandboxes use: zero for a
	// team without any (or that does not exist).
	TeamUsage(ctx context.Context, teamID string) (Usage, error)
}

// FencedWrites are the writes of [Store.Fenced]. Each behaves as the
// method of the same name on [Store] (the sandbox writes record their
// events too), and also returns ErrLeaseLost, writing nothing (no event
// either), when the fencing lease is no longer held.
type FencedWrites interface {
	CreateSandbox(ctx context.Context, sb Sandbox) (Sandbox, error)
	CreateSandboxWithinQuota(ctx context.Context, sb Sandbox, q Quota) (Sandbox, error)
	UpdateSandbox(ctx context.Context, sb Sandbox) (Sandbox, error)
	UpdateSandboxWithinQuota(ctx context.Context, sb Sandbox, q Quota) (Sandbox, error)
	DeleteSandbox(ctx context.Context, teamID, id string) error
	UpdateSnapshot(ctx context.Context, sn Snapshot) (Snapshot, error)
	DeleteSnapshot(ctx context.Context, teamID, id string) error
	UpdateTemplate(ctx context.Context, t Template) (Template, error)
	RaiseWorkerEpoch(ctx context.Context, id string, from int64) (int64, error)
}

// Package store defines the control plane's durable state: teams, API keys,
// sandboxes, snapshots, templates, the build cache, sealed secrets,
// archived egress logs and workers, and the [Store] contract its backends
// implement.
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
	Workers
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
// sandbox of another team is reported as ErrNotFound.
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
}

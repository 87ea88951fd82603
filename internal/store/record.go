package store

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"space/internal/errkind"
	"space/internal/sandbox"
)

// Team owns API keys and sandboxes.
type Team struct {
	ID   string // see ValidID
	Name string
	// Quota is the team's resource quota: opaque JSON of at most 4 KiB, or
	// nil for the server's default quota.
	Quota   json.RawMessage
	Created time.Time // set by the store
}

// APIKey authenticates a client as a member of a team.
type APIKey struct {
	ID     string // see ValidID
	TeamID string
	Name   string
	Admin  bool
	// Hash is the SHA-256 of the key's secret (see HashSecret). The secret
	// itself is never stored.
	Hash    [32]byte
	Created time.Time // set by the store
}

// HashSecret returns the hash an [APIKey] stores for secret.
func HashSecret(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

// SandboxState is the lifecycle state of a sandbox ([sandbox.State]).
type SandboxState = sandbox.State

// The sandbox states, as named in package sandbox.
const (
	StateCreating  = sandbox.Creating
	StateRunning   = sandbox.Running
	StatePaused    = sandbox.Paused
	StateStopping  = sandbox.Stopping
	StateStopped   = sandbox.Stopped
	StateSuspended = sandbox.Suspended
	StateFailed    = sandbox.Failed
	StateDeleted   = sandbox.Deleted
)

// States lists every valid SandboxState.
var States = sandbox.States

// Sandbox is the control plane's record of one sandbox.
type Sandbox struct {
	ID       string // "sbx_" + 20 lowercase base32 characters; see NewSandboxID
	TeamID   string
	Template string
	State    SandboxState
	WorkerID string // or empty before placement
	// Spec is the sandbox's requested configuration: opaque JSON, required.
	Spec json.RawMessage
	// Handle is the worker's serialized VM handle: opaque JSON, or nil.
	Handle  json.RawMessage
	Labels  map[string]string // or nil; returned as nil when empty
	Created time.Time         // set by the store
	Updated time.Time         // set by the store on every write
	Expires time.Time         // or zero for no expiry
	// Version counts writes; UpdateSandbox compares it before writing.
	Version int64
	// VCPUs and MemoryMiB are what the sandbox counts against its team's
	// quota (see [Quotas]): at least 0, set by CreateSandbox and never
	// changed (UpdateSandbox ignores them).
	VCPUs     int
	MemoryMiB int64
}

// NotLive lists the sandbox states that do not count against a team's
// quota: the sandbox holds no VM and no worker capacity. "suspended" is
// the state of a sandbox kept only as a snapshot.
var NotLive = []SandboxState{StateDeleted, StateFailed, StateStopped, StateSuspended}

// Live reports whether a sandbox in state s counts against its team's
// quota: whether s is not in NotLive.
func Live(s SandboxState) bool {
	for _, v := range NotLive {
		if s == v {
			return false
		}
	}
	return true
}

// Quota limits what a team's live sandboxes use (the fields of api.Quota
// the store enforces). A zero field is unlimited.
type Quota struct {
	Sandboxes int
	VCPUs     int
	MemoryMiB int64
}

// Usage is what a team's live sandboxes use.
type Usage struct {
	Sandboxes int
	VCPUs     int
	MemoryMiB int64
}

// Admit returns nil if u plus sb fits q, and otherwise an error wrapping
// errkind.ResourceExhausted that names team and the first limit sb would
// exceed. A sandbox in a state that is not live always fits.
func (q Quota) Admit(team string, u Usage, sb *Sandbox) error {
	if !Live(sb.State) {
		return nil
	}
	switch {
	case q.Sandboxes > 0 && u.Sandboxes+1 > q.Sandboxes:
		return &QuotaError{Limit: LimitSandboxes, Err: fmt.Errorf("team %s quota: %d of %d sandboxes in use: %w", team, u.Sandboxes, q.Sandboxes, errkind.ResourceExhausted)}
	case q.VCPUs > 0 && u.VCPUs+sb.VCPUs > q.VCPUs:
		return &QuotaError{Limit: LimitVCPUs, Err: fmt.Errorf("team %s quota: %d of %d vcpus in use, %d more requested: %w", team, u.VCPUs, q.VCPUs, sb.VCPUs, errkind.ResourceExhausted)}
	case q.MemoryMiB > 0 && u.MemoryMiB+sb.MemoryMiB > q.MemoryMiB:
		return &QuotaError{Limit: LimitMemory, Err: fmt.Errorf("team %s quota: %d of %d MiB of memory in use, %d more requested: %w", team, u.MemoryMiB, q.MemoryMiB, sb.MemoryMiB, errkind.ResourceExhausted)}
	}
	return nil
}

// QuotaLimit names the quota limit a refusal hit. Its values are wire
// format (a metric's label) and never change.
type QuotaLimit string

// The limits of a team's quota.
const (
	LimitSandboxes     QuotaLimit = "sandboxes"
	LimitVCPUs         QuotaLimit = "vcpus"
	LimitMemory        QuotaLimit = "memory"
	LimitSnapshotBytes QuotaLimit = "snapshot_bytes"
)

// QuotaError is a refusal for a team's quota: Err (which wraps
// errkind.ResourceExhausted and says what is in use) and the Limit it
// hit, so that a caller can tell the limits apart without reading the
// message.
type QuotaError struct {
	Limit QuotaLimit
	Err   error
}

func (e *QuotaError) Error() string { return e.Err.Error() }
func (e *QuotaError) Unwrap() error { return e.Err }

// Validate checks q; errors wrap ErrInvalid.
func (q Quota) Validate() error {
	if q.Sandboxes < 0 || q.VCPUs < 0 || q.MemoryMiB < 0 {
		return invalid("negative quota %+v", q)
	}
	return nil
}

// Lease is a holder's claim on a name until Expires (see [Leases]).
type Lease struct {
	Name   string
	Holder string
	// Token is the fencing token: it grows with every new acquisition of
	// any name and is never reused, so a later holder of Name always has a
	// higher one. Renewals keep it.
	Token int64
	// Acquired is when this token was handed out, Expires when the lease
	// ends unless renewed: both by the database's clock.
	Acquired time.Time
	Expires  time.Time
	// Expired reports, in what ListLeases returns, whether Expires had
	// passed by the database's clock when it was read. A lease just
	// acquired or renewed has it false.
	Expired bool
}

// ValidateLease checks a lease name, holder and ttl; errors wrap
// ErrInvalid.
func ValidateLease(name, holder string, ttl time.Duration) error {
	if !validLeaseWord(name) {
		return invalid("lease name %.100q", name)
	}
	if !validLeaseWord(holder) {
		return invalid("lease %s: holder %.100q", name, holder)
	}
	if ttl < time.Millisecond {
		return invalid("lease %s: ttl %v, want at least 1ms", name, ttl)
	}
	return nil
}

// validLeaseWord reports whether w is 1 to 256 bytes of printable ASCII
// other than space.
func validLeaseWord(w string) bool {
	if w == "" || len(w) > maxNameLen {
		return false
	}
	for i := range len(w) {
		if w[i] < 0x21 || w[i] > 0x7e {
			return false
		}
	}
	return true
}

// Filter selects sandboxes in ListSandboxes. The zero Filter matches all.
type Filter struct {
	States []SandboxState    // any of these; or nil for any state
	Labels map[string]string // all of these; or nil
}

// SnapshotState is the lifecycle state of a snapshot. Its string value is
// stored and sent over the API, and never changes.
type SnapshotState string

// The snapshot states.
const (
	SnapshotCreating SnapshotState = "creating" // being written; Manifest may still be empty
	SnapshotReady    SnapshotState = "ready"    // complete; sandboxes may start from it
	SnapshotDeleting SnapshotState = "deleting" // being removed; no new sandbox may use it
)

// SnapshotStates lists every valid SnapshotState.
var SnapshotStates = []SnapshotState{SnapshotCreating, SnapshotReady, SnapshotDeleting}

func (s SnapshotState) String() string { return string(s) }

// Valid reports whether s is one of SnapshotStates.
func (s SnapshotState) Valid() bool {
	for _, v := range SnapshotStates {
		if s == v {
			return true
		}
	}
	return false
}

// Snapshot is the control plane's record of one sandbox snapshot
// (checkpoint, fork source or suspended sandbox).
type Snapshot struct {
	ID     string // "snp_" + 20 lowercase base32 characters; see NewSnapshotID
	TeamID string
	// SandboxID is the sandbox the snapshot was taken from. That sandbox
	// may since have been deleted.
	SandboxID string
	// Name is "" or unique within the team; see ValidID for its form.
	Name     string
	State    SnapshotState
	WorkerID string // the worker holding a local copy, or empty
	// Manifest is the snapshot's manifest ID in the chunk store, or empty
	// while the snapshot is being created.
	Manifest     string
	LogicalBytes int64 // the size of the snapshot's files
	NewBytes     int64 // what the snapshot added to the chunk store
	// Meta describes how to restore the snapshot (VMM, versions, kernel):
	// opaque JSON, or nil.
	Meta    json.RawMessage
	Created time.Time // set by the store
	Updated time.Time // set by the store on every write
	// Version counts writes; UpdateSnapshot compares it before writing.
	Version int64
}

// TemplateState is the lifecycle state of a template version. Its string
// value is stored and sent over the API, and never changes.
type TemplateState string

// The template states.
const (
	TemplateBuilding TemplateState = "building" // its build runs; no sandbox may use it
	TemplateReady    TemplateState = "ready"    // sandboxes may start from it
	TemplateFailed   TemplateState = "failed"   // its build failed; kept for its report
	TemplateDeleting TemplateState = "deleting" // being removed
)

// TemplateStates lists every valid TemplateState.
var TemplateStates = []TemplateState{TemplateBuilding, TemplateReady, TemplateFailed, TemplateDeleting}

func (s TemplateState) String() string { return string(s) }

// Valid reports whether s is one of TemplateStates.
func (s TemplateState) Valid() bool {
	for _, v := range TemplateStates {
		if s == v {
			return true
		}
	}
	return false
}

// Template is one version of a team's template: the recipe and outcome of
// one build.
type Template struct {
	TeamID string
	Name   string // see ValidTemplateName; with Version, unique within the team
	// Version is 1, 2, ...: CreateTemplate assigns the next number of the
	// team's template Name. A number is never reused, not even once its
	// version is deleted.
	Version int
	State   TemplateState
	Key     string // the build's cache key (see ValidCacheKey), or ""
	// SnapshotID is the warm snapshot sandboxes restore from
	// (see ValidSnapshotID), or "" until the template is ready. The
	// snapshot record need not exist.
	SnapshotID string
	// Meta describes the template (environment, start command, build
	// report): opaque JSON of at most 1 MiB, or nil.
	Meta    json.RawMessage
	Created time.Time // set by the store
	Updated time.Time // set by the store on every write
	// Rev counts writes; UpdateTemplate compares it before writing.
	Rev int64
}

// BuildCacheEntry records that a team's build step with cache key Key left
// the file system captured in snapshot SnapshotID.
type BuildCacheEntry struct {
	TeamID string
	Key    string // see ValidCacheKey; unique within the team
	// SnapshotID is a snapshot ID (see ValidSnapshotID). The snapshot record
	// need not exist.
	SnapshotID string
	Created    time.Time // set by the store
}

// Secret is a team's named credential, as the control plane sealed it
// (see package secrets): the store never sees the value itself.
type Secret struct {
	TeamID string
	Name   string // see ValidSecretName; unique within the team
	// Sealed is the sealed value: 1 byte to MaxSealedSecret.
	Sealed []byte
	// Hosts are the exact host names whose requests may carry the value:
	// 1 to 16 names of 1 to 253 bytes of [a-z0-9._-].
	Hosts []string
	// Header is an HTTP header the value is sent in, or "": at most 256
	// bytes.
	Header string
	// Format is the header's value with "{}" standing for the secret's,
	// or "": at most 1 KiB.
	Format  string
	Created time.Time // set by the store
	Updated time.Time // set by the store on every write
}

// EgressLog is one archived segment of a sandbox's egress audit log.
type EgressLog struct {
	TeamID    string
	SandboxID string // see ValidSandboxID; the sandbox record need not exist
	// LogID names the worker's log it was copied from (worker, slot and
	// run), unique per run of the sandbox: 1 to 200 bytes of printable
	// ASCII without spaces.
	LogID   string
	Created time.Time // set by the store; a replacement keeps it
	// Data is opaque to the store (the control plane stores gzipped JSON
	// lines): at most MaxEgressLogBytes, returned as nil when empty.
	Data []byte
}

// Worker is a host that runs sandboxes.
type Worker struct {
	ID            string // see ValidID
	Address       string // where the control plane reaches the worker
	VCPUs         int    // capacity
	MemoryMiB     int64  // capacity
	LastHeartbeat time.Time
	// Protocol is the version of the worker protocol it speaks, or 0 if
	// it did not say.
	Protocol int
	// Capabilities describes what the worker can do (hypervisors, features):
	// opaque JSON of at most 64 KiB, or nil.
	Capabilities json.RawMessage
	// Epoch is the worker's fencing epoch (workerproto.LeaseRequest): 0
	// until its sandboxes are first taken away from it, then raised by
	// RaiseWorkerEpoch only. UpsertWorker ignores it.
	Epoch int64
}

const (
	sandboxPrefix   = "sbx_"
	snapshotPrefix  = "snp_"
	idChars         = 20
	maxIDLen        = 128
	maxNameLen      = 256
	maxLabels       = 64
	maxLabelKey     = 63
	maxLabelValue   = 256
	maxQuota        = 4 << 10 // bytes
	maxTemplateLen  = 64
	maxCacheKeyLen  = 128
	maxTemplateMeta = 1 << 20 // bytes
	maxSecretName   = 64
	maxSecretHosts  = 16
	maxHostLen      = 253
	maxHeaderLen    = 256
	maxFormatLen    = 1 << 10 // bytes
	maxLogIDLen     = 200
	maxCapabilities = 64 << 10 // bytes
)

// MaxSealedSecret bounds [Secret.Sealed]: a value of 64 KiB and the
// sealing overhead, with room to spare.
const MaxSealedSecret = 64<<10 + 1<<10

// MaxEgressLogBytes bounds [EgressLog.Data]: one worker's log of one run
// of a sandbox, compressed.
const MaxEgressLogBytes = 64 << 20

// lowercase RFC 4648 base32 alphabet
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns prefix followed by 20 random lowercase base32 characters
// (100 bits).
func NewID(prefix string) string {
	var b [13]byte // 104 bits → 21 characters, trimmed to 20
	rand.Read(b[:])
	return prefix + idEncoding.EncodeToString(b[:])[:idChars]
}

// NewSandboxID returns a fresh sandbox ID.
func NewSandboxID() string { return NewID(sandboxPrefix) }

// ValidSandboxID reports whether id has the form NewSandboxID produces.
func ValidSandboxID(id string) bool { return validRandomID(id, sandboxPrefix) }

// NewSnapshotID returns a fresh snapshot ID.
func NewSnapshotID() string { return NewID(snapshotPrefix) }

// ValidSnapshotID reports whether id has the form NewSnapshotID produces.
func ValidSnapshotID(id string) bool { return validRandomID(id, snapshotPrefix) }

// validRandomID reports whether id has the form NewID(prefix) produces.
func validRandomID(id, prefix string) bool {
	rest, ok := strings.CutPrefix(id, prefix)
	if !ok || len(rest) != idChars {
		return false
	}
	for _, c := range rest {
		if !('a' <= c && c <= 'z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}

// ValidID reports whether id is acceptable as a team, API key or worker ID,
// a snapshot name or a chunk store manifest ID: 1 to 128 characters from
// [A-Za-z0-9_.-].
func ValidID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, c := range id {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// ValidTemplateName reports whether name is acceptable as a template name:
// a ValidID of at most 64 characters (so never containing ':', which
// separates a name from a version in references like "base:3").
func ValidTemplateName(name string) bool { return ValidID(name) && len(name) <= maxTemplateLen }

// ValidSecretName reports whether name is acceptable as a secret name: a
// ValidID of at most 64 characters.
func ValidSecretName(name string) bool { return ValidID(name) && len(name) <= maxSecretName }

// ValidCacheKey reports whether key is acceptable as a build cache key: 1
// to 128 lowercase hexadecimal characters.
func ValidCacheKey(key string) bool {
	if key == "" || len(key) > maxCacheKeyLen {
		return false
	}
	for _, c := range key {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, ErrInvalid)...)
}

// Validate checks t's caller-set fields; errors wrap ErrInvalid.
func (t *Team) Validate() error {
	if !ValidID(t.ID) {
		return invalid("team id %q", t.ID)
	}
	if len(t.Name) > maxNameLen {
		return invalid("team %s: name longer than %d bytes", t.ID, maxNameLen)
	}
	if err := ValidateQuota(t.Quota); err != nil {
		return fmt.Errorf("team %s: %w", t.ID, err)
	}
	return nil
}

// ValidateQuota checks a [Team] quota: nil, or valid JSON of at most 4 KiB.
// Errors wrap ErrInvalid.
func ValidateQuota(quota json.RawMessage) error {
	if quota == nil {
		return nil
	}
	if len(quota) > maxQuota {
		return invalid("quota longer than %d bytes", maxQuota)
	}
	if !json.Valid(quota) {
		return invalid("quota is not valid json")
	}
	return nil
}

// Validate checks k's caller-set fields; errors wrap ErrInvalid.
func (k *APIKey) Validate() error {
	if !ValidID(k.ID) {
		return invalid("api key id %q", k.ID)
	}
	if !ValidID(k.TeamID) {
		return invalid("api key %s: team id %q", k.ID, k.TeamID)
	}
	if len(k.Name) > maxNameLen {
		return invalid("api key %s: name longer than %d bytes", k.ID, maxNameLen)
	}
	if k.Hash == ([32]byte{}) {
		return invalid("api key %s: empty hash", k.ID)
	}
	return nil
}

// Validate checks sb's caller-set fields; errors wrap ErrInvalid.
func (sb *Sandbox) Validate() error {
	if !ValidSandboxID(sb.ID) {
		return invalid("sandbox id %q", sb.ID)
	}
	if !ValidID(sb.TeamID) {
		return invalid("sandbox %s: team id %q", sb.ID, sb.TeamID)
	}
	if sb.Template == "" || len(sb.Template) > maxNameLen {
		return invalid("sandbox %s: template %q", sb.ID, sb.Template)
	}
	if !sb.State.Valid() {
		return invalid("sandbox %s: state %q", sb.ID, sb.State)
	}
	if sb.WorkerID != "" && !ValidID(sb.WorkerID) {
		return invalid("sandbox %s: worker id %q", sb.ID, sb.WorkerID)
	}
	if len(sb.Spec) == 0 || !json.Valid(sb.Spec) {
		return invalid("sandbox %s: spec is not valid json", sb.ID)
	}
	if sb.Handle != nil && !json.Valid(sb.Handle) {
		return invalid("sandbox %s: handle is not valid json", sb.ID)
	}
	if err := validateLabels(sb.Labels); err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	if sb.VCPUs < 0 || sb.MemoryMiB < 0 {
		return invalid("sandbox %s: negative resources", sb.ID)
	}
	return nil
}

// Validate checks sn's caller-set fields; errors wrap ErrInvalid.
func (sn *Snapshot) Validate() error {
	if !ValidSnapshotID(sn.ID) {
		return invalid("snapshot id %q", sn.ID)
	}
	if !ValidID(sn.TeamID) {
		return invalid("snapshot %s: team id %q", sn.ID, sn.TeamID)
	}
	if !ValidSandboxID(sn.SandboxID) {
		return invalid("snapshot %s: sandbox id %q", sn.ID, sn.SandboxID)
	}
	if sn.Name != "" && !ValidID(sn.Name) {
		return invalid("snapshot %s: name %q", sn.ID, sn.Name)
	}
	if !sn.State.Valid() {
		return invalid("snapshot %s: state %q", sn.ID, sn.State)
	}
	if sn.WorkerID != "" && !ValidID(sn.WorkerID) {
		return invalid("snapshot %s: worker id %q", sn.ID, sn.WorkerID)
	}
	if sn.Manifest != "" && !ValidID(sn.Manifest) {
		return invalid("snapshot %s: manifest %q", sn.ID, sn.Manifest)
	}
	if sn.LogicalBytes < 0 || sn.NewBytes < 0 {
		return invalid("snapshot %s: negative size", sn.ID)
	}
	if sn.Meta != nil && !json.Valid(sn.Meta) {
		return invalid("snapshot %s: meta is not valid json", sn.ID)
	}
	return nil
}

// Validate checks t's caller-set fields; errors wrap ErrInvalid. It does not
// check Version, which CreateTemplate assigns.
func (t *Template) Validate() error {
	if !ValidID(t.TeamID) {
		return invalid("template %s: team id %q", t.Name, t.TeamID)
	}
	if !ValidTemplateName(t.Name) {
		return invalid("template name %q", t.Name)
	}
	if !t.State.Valid() {
		return invalid("template %s: state %q", t.Name, t.State)
	}
	if t.Key != "" && !ValidCacheKey(t.Key) {
		return invalid("template %s: cache key %q", t.Name, t.Key)
	}
	if t.SnapshotID != "" && !ValidSnapshotID(t.SnapshotID) {
		return invalid("template %s: snapshot id %q", t.Name, t.SnapshotID)
	}
	if len(t.Meta) > maxTemplateMeta {
		return invalid("template %s: meta longer than %d bytes", t.Name, maxTemplateMeta)
	}
	if t.Meta != nil && !json.Valid(t.Meta) {
		return invalid("template %s: meta is not valid json", t.Name)
	}
	return nil
}

// Validate checks e's caller-set fields; errors wrap ErrInvalid.
func (e *BuildCacheEntry) Validate() error {
	if !ValidID(e.TeamID) {
		return invalid("build cache entry %s: team id %q", e.Key, e.TeamID)
	}
	if !ValidCacheKey(e.Key) {
		return invalid("build cache key %q", e.Key)
	}
	if !ValidSnapshotID(e.SnapshotID) {
		return invalid("build cache entry %s: snapshot id %q", e.Key, e.SnapshotID)
	}
	return nil
}

// Validate checks f; errors wrap ErrInvalid.
func (f *Filter) Validate() error {
	for _, s := range f.States {
		if !s.Valid() {
			return invalid("filter state %q", s)
		}
	}
	return validateLabels(f.Labels)
}

func validateLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return invalid("more than %d labels", maxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > maxLabelKey {
			return invalid("label key %q", k)
		}
		if len(v) > maxLabelValue {
			return invalid("label %s: value longer than %d bytes", k, maxLabelValue)
		}
	}
	return nil
}

// Validate checks w; errors wrap ErrInvalid.
func (w *Worker) Validate() error {
	if !ValidID(w.ID) {
		return invalid("worker id %q", w.ID)
	}
	if w.Address == "" || len(w.Address) > maxNameLen {
		return invalid("worker %s: address %q", w.ID, w.Address)
	}
	if w.VCPUs < 0 || w.MemoryMiB < 0 {
		return invalid("worker %s: negative capacity", w.ID)
	}
	if w.LastHeartbeat.IsZero() {
		return invalid("worker %s: zero heartbeat time", w.ID)
	}
	if w.Protocol < 0 {
		return invalid("worker %s: negative protocol %d", w.ID, w.Protocol)
	}
	if len(w.Capabilities) > maxCapabilities {
		return invalid("worker %s: capabilities longer than %d bytes", w.ID, maxCapabilities)
	}
	if w.Capabilities != nil && !json.Valid(w.Capabilities) {
		return invalid("worker %s: capabilities are not valid json", w.ID)
	}
	return nil
}

// Match reports whether sb passes f.
func (f *Filter) Match(sb *Sandbox) bool {
	if len(f.States) > 0 {
		ok := false
		for _, s := range f.States {
			ok = ok || s == sb.State
		}
		if !ok {
			return false
		}
	}
	for k, v := range f.Labels {
		if got, ok := sb.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// StoredTime returns t in the precision and zone the stores keep: UTC, whole
// microseconds.
func StoredTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// Validate checks sc's caller-set fields; errors wrap ErrInvalid. It checks
// form and size only: what the hosts, header and format mean is the
// control plane's to check.
func (sc *Secret) Validate() error {
	if !ValidID(sc.TeamID) {
		return invalid("secret: team id %q", sc.TeamID)
	}
	if !ValidSecretName(sc.Name) {
		return invalid("secret name %.100q", sc.Name)
	}
	if len(sc.Sealed) == 0 || len(sc.Sealed) > MaxSealedSecret {
		return invalid("secret %s: sealed value of %d bytes, want 1 to %d", sc.Name, len(sc.Sealed), MaxSealedSecret)
	}
	if len(sc.Hosts) == 0 || len(sc.Hosts) > maxSecretHosts {
		return invalid("secret %s: %d hosts, want 1 to %d", sc.Name, len(sc.Hosts), maxSecretHosts)
	}
	for _, h := range sc.Hosts {
		if !validHostChars(h) {
			return invalid("secret %s: host %.100q", sc.Name, h)
		}
	}
	if len(sc.Header) > maxHeaderLen {
		return invalid("secret %s: header longer than %d bytes", sc.Name, maxHeaderLen)
	}
	if len(sc.Format) > maxFormatLen {
		return invalid("secret %s: format longer than %d bytes", sc.Name, maxFormatLen)
	}
	return nil
}

// validHostChars reports whether h is 1 to 253 bytes of [a-z0-9._-].
func validHostChars(h string) bool {
	if h == "" || len(h) > maxHostLen {
		return false
	}
	for _, c := range h {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Validate checks e's caller-set fields; errors wrap ErrInvalid.
func (e EgressLog) Validate() error {
	if !ValidID(e.TeamID) {
		return invalid("egress log: team id %q", e.TeamID)
	}
	if !ValidSandboxID(e.SandboxID) {
		return invalid("egress log: sandbox id %.100q", e.SandboxID)
	}
	if !validLogID(e.LogID) {
		return invalid("egress log of %s: log id %.100q", e.SandboxID, e.LogID)
	}
	if len(e.Data) > MaxEgressLogBytes {
		return invalid("egress log %s of %s: %d bytes of data, want at most %d", e.LogID, e.SandboxID, len(e.Data), MaxEgressLogBytes)
	}
	return nil
}

// validLogID reports whether id is 1 to 200 bytes of printable ASCII
// other than space (0x21 to 0x7e).
func validLogID(id string) bool {
	if id == "" || len(id) > maxLogIDLen {
		return false
	}
	for i := range len(id) {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// Package controlplane serves SPACE's public API (/v1): it authenticates
// API keys, owns the truth about sandboxes in the store, enforces team
// isolation and quotas, places sandboxes on workers and forwards each
// sandbox's data-plane requests (exec, processes, files) to its worker.
//
// A sandbox is acknowledged only once the store says so: create records it
// (creating) before asking the worker, and marks it running after; delete
// records stopping before the worker destroys the VM. Reconcile, run at
// start, settles whatever a crash left between those steps.
//
// Nothing another replica needs to see is kept in memory: claims on
// records are leases in the store (claims.go), quotas are checked by the
// store in the transaction that records a sandbox. Server.mu is never
// held across store or worker calls.
package controlplane

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"space/api"
	"space/internal/checkpoint"
	"space/internal/dataplane"
	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/leader"
	"space/internal/origin"
	"space/internal/secrets"
	"space/internal/store"
	"space/internal/templatebuild"
	"space/internal/webhook"
)

// Defaults and bounds of a sandbox's resources.
type Limits struct {
	DefaultVCPUs, MaxVCPUs         int
	DefaultMemoryMiB, MinMemoryMiB int64
	MaxMemoryMiB                   int64
	DefaultDiskMiB, MinDiskMiB     int64
	MaxDiskMiB                     int64
	DefaultTTL, MaxTTL             time.Duration
}

// DefaultLimits are the limits the OpenAPI document states.
var DefaultLimits = Limits{
	DefaultVCPUs: 1, MaxVCPUs: 8,
	DefaultMemoryMiB: 512, MinMemoryMiB: 128, MaxMemoryMiB: 16384,
	DefaultDiskMiB: 4096, MinDiskMiB: 512, MaxDiskMiB: 65536,
	DefaultTTL: time.Hour, MaxTTL: 7 * 24 * time.Hour,
}

// Quota limits what one team may hold at once; 0 = unlimited.
type Quota = api.Quota

// DefaultQuota is every team's quota unless configured otherwise.
var DefaultQuota = Quota{Sandboxes: 50, VCPUs: 64, MemoryMiB: 128 << 10, SnapshotMiB: 100 << 10}

// Config configures a Server.
type Config struct {
	// Store holds the state. Required; the caller closes it.
	Store store.Store
	// Templates names the templates sandboxes may use; the first is the
	// default. Required.
	Templates []string
	// Images makes and finds templates' base images; nil = this server
	// builds no templates.
	Images *templatebuild.Images
	// BuildDir holds build contexts while their templates are built.
	BuildDir string
	// Secrets seals the teams' secrets before they are stored; nil = this
	// server keeps no secrets (the /v1/secrets routes answer 409
	// failed_precondition).
	Secrets *secrets.Box
	// Limits bound a sandbox's resources; zero value = DefaultLimits.
	Limits Limits
	// Quota is each team's quota; zero value = DefaultQuota.
	Quota Quota
	// ReapInterval is how often, at the latest, expired sandboxes are
	// looked for; 0 = 5s. A sandbox whose expiry falls within the next
	// interval, or was set on this replica, goes at its expiry.
	ReapInterval time.Duration
	// ReconcileInterval is how often every worker's sandboxes are
	// compared with the store (a VM that died is marked failed); 0 = 30s.
	ReconcileInterval time.Duration
	// DefaultCheckpoints is the checkpoint policy of sandboxes created
	// without one; nil = none. New checks it.
	DefaultCheckpoints *api.CheckpointPolicy
	// DefaultOnTimeout is what the timeout of a sandbox created without
	// on_timeout does: "" or "delete" (it is deleted), or "suspend" (its
	// timeout is an idle time after which it is written to the chunk
	// store and its host memory freed). New checks it.
	DefaultOnTimeout string
	// RecoverAfter is how long a standalone worker that takes leases
	// (workerproto.Capabilities.Fencing) may go without one before the
	// leader fences it and restores its sandboxes on other workers from
	// their latest checkpoints (recovery.go); 0 = DefaultRecoverAfter,
	// negative = never. At least 6s.
	RecoverAfter time.Duration
	// CheckpointInterval is how often the leader looks for sandboxes
	// whose checkpoint is due; 0 = 1s.
	CheckpointInterval time.Duration
	// EgressLogRetention is how long sandboxes' archived egress logs are
	// kept; 0 = DefaultEgressLogRetention, negative = for ever.
	EgressLogRetention time.Duration
	// EventRetention is how long sandboxes' lifecycle events are kept;
	// 0 = DefaultEventRetention, negative = for ever.
	EventRetention time.Duration
	// AuditRetention is how long audit log entries are kept (audit.go);
	// 0 = DefaultAuditRetention, negative = for ever.
	AuditRetention time.Duration
	// DataPlaneURL is where clients send the data-plane requests of
	// sandboxes on standalone workers (a `space proxy` in front of them,
	// see package dataplane); "" = this server. Sandboxes on this
	// process's own worker are always served here.
	DataPlaneURL string
	// DataPlaneTTL is how long a data-plane token is valid; 0 =
	// DefaultDataPlaneTTL.
	DataPlaneTTL time.Duration
	// WorkerToken authenticates standalone workers (their registration,
	// and the control plane's calls to them) and keys the data-plane
	// tokens (package dataplane); "" = no standalone workers and no
	// data-plane tokens (clients send data-plane requests here with
	// their API key).
	WorkerToken string
	// CrashAt names a crash point (see CrashPoints); "" = never. For tests.
	CrashAt string
	// Version is reported by /v1/health.
	Version string
	// Elector, if set, makes the elector of the leader for background
	// work, campaigning as holder (a Kubernetes Lease's, package
	// leader/kube); nil = the store's leader lease.
	Elector func(holder string) (leader.Elector, error)
	// LeaderTTL is how long the leader's lease lasts unrenewed: a dead
	// leader's successor takes over within about 4/3 of it; 0 = 6s.
	LeaderTTL time.Duration
	// ReplicaID names this control plane among the replicas sharing the
	// store: unique, and the same across restarts (so a restarted
	// replica knows its earlier life's claims for dead); "" = a random
	// one.
	ReplicaID string
	// Metrics is where New registers the control plane's Prometheus
	// metrics (metrics.go); nil = they are kept but not exported.
	Metrics prometheus.Registerer
	// Webhooks configures the delivery of the teams' webhooks
	// (webhooks.go); the zero value is the production setting.
	Webhooks WebhookConfig
	// MetricsTeams is how many teams, those with the most sandboxes,
	// space_team_sandboxes names (the others are summed as "other"): 0 =
	// DefaultMetricsTeams; negative = the family is not reported.
	MetricsTeams int
	// Log receives events; nil = discard.
	Log *slog.Logger
	// Now is the clock; nil = time.Now.
	Now func() time.Time
}

// leaderLease is the name of the lease of the replica that does the
// background work.
const leaderLease = "leader"

// CrashPoints are the control plane's crash points.
var CrashPoints = []string{
	"api.create.recorded",    // store says creating; the worker was not asked
	"api.create.worker-done", // the worker runs it; the store says creating
	"api.delete.stopping-saved",
	"api.suspend.stopping-saved", // snapshot taken, store says stopping; the VM runs
	"api.resume.creating-saved",  // store says creating on a worker; it was not asked
	"api.snapshot.worker-done",   // the worker holds the snapshot; the store says creating
	"api.fork.child-created",     // a fork's child runs; its snapshot says creating
	"api.template.step-cached",   // a build cached its first step; its version says building
}

// Server is the control plane.
type Server struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	// sealer, plane and remotes serve the data plane with tokens; nil
	// without a worker token.
	sealer  *dataplane.Sealer
	plane   *dataplane.Handler
	remotes *Remotes
	// claims are this replica's claims on records (see claims.go).
	claims *claims
	// expiries tell the leader loop of expiries set here (expiries.go).
	expiries *expiryHints
	// elector decides which replica does the background work (Run).
	elector leader.Elector
	metrics *metrics
	// bell wakes this replica's event followers (events.go); every
	// write through cfg.Store that may record an event rings it.
	bell *bell
	// hookGuard, hookSender and hooks deliver the teams' webhooks
	// (webhooks.go): hooks runs on the leader only.
	hookGuard  *webhook.Guard
	hookSender *webhook.Sender
	hooks      *webhook.Dispatcher
	auditor    *auditor

	mu sync.Mutex
	// +checklocks:mu
	workers map[string]Worker
	// +checklocks:mu
	seen map[string]time.Time // last registration of each standalone worker
	// +checklocks:mu
	leased map[string]time.Time // expiry of the Lease of each worker found through one; zero once it ended
	// +checklocks:mu
	probes  map[string]*probe // per worker: what its last probe said
	probing sync.WaitGroup    // probes out
}

// New validates cfg and returns a server with no workers.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || len(cfg.Templates) == 0 {
		return nil, fmt.Errorf("controlplane: store and templates are required: %w", errkind.InvalidArgument)
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.Quota == (Quota{}) {
		cfg.Quota = DefaultQuota
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = 5 * time.Second
	}
	if cfg.EgressLogRetention == 0 {
		cfg.EgressLogRetention = DefaultEgressLogRetention
	}
	if cfg.EventRetention == 0 {
		cfg.EventRetention = DefaultEventRetention
	}
	if cfg.AuditRetention == 0 {
		cfg.AuditRetention = DefaultAuditRetention
	}
	if cfg.ReconcileInterval == 0 {
		cfg.ReconcileInterval = 30 * time.Second
	}
	if cfg.RecoverAfter == 0 {
		cfg.RecoverAfter = DefaultRecoverAfter
	}
	if cfg.RecoverAfter > 0 && cfg.RecoverAfter < 6*time.Second {
		return nil, fmt.Errorf("controlplane: recover after %v: want at least 6s (or negative: never): %w", cfg.RecoverAfter, errkind.InvalidArgument)
	}
	switch cfg.DefaultOnTimeout {
	case "", onTimeoutDelete:
		cfg.DefaultOnTimeout = ""
	case onTimeoutSuspend:
	default:
		return nil, fmt.Errorf("controlplane: default on_timeout %.64q is neither %s nor %s: %w", cfg.DefaultOnTimeout, onTimeoutDelete, onTimeoutSuspend, errkind.InvalidArgument)
	}
	if cfg.Limits.DefaultTTL < time.Second || cfg.Limits.DefaultTTL > cfg.Limits.MaxTTL {
		return nil, fmt.Errorf("controlplane: default timeout %v is outside 1s..%v: %w", cfg.Limits.DefaultTTL, cfg.Limits.MaxTTL, errkind.InvalidArgument)
	}
	if cfg.CheckpointInterval == 0 {
		cfg.CheckpointInterval = time.Second
	}
	if cfg.DefaultCheckpoints != nil {
		pol, err := checkpoint.FromAPI("checkpoints", *cfg.DefaultCheckpoints)
		if err != nil {
			return nil, fmt.Errorf("controlplane: default checkpoint policy: %w", err)
		}
		cfg.DefaultCheckpoints = nil
		if !pol.Off() {
			p := pol.API()
			cfg.DefaultCheckpoints = &p
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	if cfg.DataPlaneTTL == 0 {
		cfg.DataPlaneTTL = DefaultDataPlaneTTL
	}
	if cfg.DataPlaneURL != "" {
		if u, err := url.Parse(cfg.DataPlaneURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			return nil, fmt.Errorf("controlplane: data-plane url %q: want http(s)://host[:port][/prefix]: %w", cfg.DataPlaneURL, errkind.InvalidArgument)
		}
	}
	bell := newBell()
	cfg.Store = ringing{cfg.Store, bell}
	s := &Server{
		bell:    bell,
		cfg:     cfg,
		log:     cfg.Log.With("component", "controlplane"),
		now:     now,
		workers: make(map[string]Worker),
		seen:    make(map[string]time.Time),
		leased:  make(map[string]time.Time),
		probes:  make(map[string]*probe),
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = store.NewID("cp-")
		s.cfg.ReplicaID = cfg.ReplicaID // the leader's actor in events names it
	}
	if err := store.ValidateLease("leader", holderOf(cfg.ReplicaID), time.Second); err != nil || strings.Contains(cfg.ReplicaID, "/") {
		return nil, fmt.Errorf("controlplane: replica id %q: want printable ASCII without spaces or slashes: %w", cfg.ReplicaID, errkind.InvalidArgument)
	}
	reg := cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	var err error
	if s.metrics, err = newMetrics(reg, cfg.Store); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	s.claims = newClaims(cfg.Store, cfg.ReplicaID, s.log, s.metrics.claimsLost)
	s.expiries = newExpiryHints()
	var e leader.Elector
	if cfg.Elector != nil {
		e, err = cfg.Elector(s.claims.holder)
	} else {
		e, err = leader.New(leader.Config{Holder: s.claims.holder, Name: leaderLease, TTL: cfg.LeaderTTL, Log: cfg.Log}, cfg.Store)
	}
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	s.elector = e
	if err := registerReplica(reg, s); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	if err := s.newWebhooks(reg); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	if s.auditor, err = newAuditor(reg, cfg.Store, s.log); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	if n := cmp.Or(cfg.MetricsTeams, DefaultMetricsTeams); n > 0 {
		if err := reg.Register(newTeamsCollector(cfg.Store, n)); err != nil {
			return nil, fmt.Errorf("controlplane: register metrics: %w", err)
		}
	}
	if cfg.WorkerToken != "" {
		var err error
		if s.sealer, err = dataplane.NewSealer(cfg.WorkerToken); err != nil {
			return nil, err
		}
		s.remotes = NewRemotes(cfg.WorkerToken)
		if s.plane, err = NewDataPlane(cfg.WorkerToken, planeWorkers{s}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// AddWorker makes w available for placement and data-plane forwarding,
// replacing a worker of the same ID.
func (s *Server) AddWorker(w Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.workers[w.ID()] = w
}

func (s *Server) worker(id string) (Worker, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.workers[id]
	if !ok {
		return nil, fmt.Errorf("worker %q is not connected: %w", id, errkind.Unavailable)
	}
	return w, nil
}

func (s *Server) workerList() []Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := make([]Worker, 0, len(s.workers))
	for _, w := range s.workers {
		ws = append(ws, w)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].ID() < ws[j].ID() })
	return ws
}

func (s *Server) crash(step string) {
	if s.cfg.CrashAt == step {
		s.log.Warn("crashing at crash point", "step", step)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// DefaultTeam is the team of the first admin key.
const DefaultTeam = "default"

// Bootstrap makes sure the default team and an admin key exist. When it
// creates the key it returns its secret (shown once); otherwise "".
// hasKey reports whether the caller still holds a key secret (the admin
// key file); when it does, no new key is made.
func (s *Server) Bootstrap(ctx context.Context, hasKey bool) (secret string, err error) {
	if _, err := s.cfg.Store.CreateTeam(ctx, store.Team{ID: DefaultTeam, Name: "default"}); err != nil && !errors.Is(err, store.ErrAlreadyExists) {
		return "", fmt.Errorf("bootstrap: %w", err)
	}
	if hasKey {
		return "", nil
	}
	k, secret, err := s.newKey(ctx, DefaultTeam, "admin (first start)", true)
	if err != nil {
		return "", fmt.Errorf("bootstrap: %w", err)
	}
	s.log.Info("created the first admin key", "key_id", k.ID)
	return secret, nil
}

// MinAdminKeyLength is the shortest secret BootstrapKey accepts.
const MinAdminKeyLength = 32

// BootstrapKey makes sure secret is an admin key of the default team: the
// key an operator provisioned (a Kubernetes Secret shared by every
// replica), in place of one made at the first start and kept in a data
// dir. It stores the key when no key has that secret, so replicas
// starting together, or one restarting, make it once; a key with that
// secret that is not an admin key is refused.
func (s *Server) BootstrapKey(ctx context.Context, secret string) error {
	if len(secret) < MinAdminKeyLength || strings.ContainsFunc(secret, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return fmt.Errorf("admin key: want at least %d printable characters without spaces: %w", MinAdminKeyLength, errkind.InvalidArgument)
	}
	if _, err := s.Bootstrap(ctx, true); err != nil {
		return err
	}
	hash := store.HashSecret(secret)
	for attempt := 0; ; attempt++ {
		k, err := s.cfg.Store.APIKeyByHash(ctx, hash)
		switch {
		case err == nil && !k.Admin:
			return fmt.Errorf("admin key: the provisioned secret is that of key %s, which is not an admin key: %w", k.ID, errkind.FailedPrecondition)
		case err == nil:
			return nil
		case !errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("admin key: %w", err)
		}
		k, err = s.cfg.Store.CreateAPIKey(ctx, store.APIKey{
			ID: store.NewID("key_"), TeamID: DefaultTeam, Name: "admin (provisioned)", Admin: true, Hash: hash,
		})
		switch {
		case err == nil:
			s.log.Info("stored the provisioned admin key", "key_id", k.ID)
			return nil
		case errors.Is(err, store.ErrAlreadyExists) && attempt == 0:
			continue // another replica stored it first: look again
		default:
			return fmt.Errorf("admin key: %w", err)
		}
	}
}

// newKey stores a new API key and returns it with its secret.
func (s *Server) newKey(ctx context.Context, team, name string, admin bool) (store.APIKey, string, error) {
	var b [32]byte
	rand.Read(b[:])
	secret := "sk_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
	k, err := s.cfg.Store.CreateAPIKey(ctx, store.APIKey{
		ID: store.NewID("key_"), TeamID: team, Name: name, Admin: admin, Hash: store.HashSecret(secret),
	})
	return k, secret, err
}

// caller is the authenticated key of a request.
type caller struct {
	team  string
	admin bool
	keyID string
}

type callerKey struct{}

func callerOf(r *http.Request) caller { return r.Context().Value(callerKey{}).(caller) }

// authenticate resolves the bearer key, or answers 401.
func (s *Server) authenticate(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || secret == "" || len(secret) > 256 {
			httpapi.WriteError(w, fmt.Errorf("missing bearer api key (Authorization: Bearer <key>): %w", httpapi.ErrUnauthenticated))
			return
		}
		k, err := s.cfg.Store.APIKeyByHash(r.Context(), store.HashSecret(secret))
		if errors.Is(err, store.ErrNotFound) {
			httpapi.WriteError(w, fmt.Errorf("unknown api key: %w", httpapi.ErrUnauthenticated))
			return
		}
		if err != nil {
			httpapi.WriteError(w, err)
			return
		}
		c := caller{team: k.TeamID, admin: k.Admin, keyID: k.ID}
		noteCaller(r.Context(), c)
		ctx := context.WithValue(r.Context(), callerKey{}, c)
		next(w, r.WithContext(origin.SetActor(ctx, origin.KindKey, k.ID)))
	}
}

// route is one public route; Routes lists them for the OpenAPI check.
type route struct {
	method, path string
	handler      http.HandlerFunc
	public       bool // no authentication
}

func (s *Server) routes() []route {
	sb := "/v1/sandboxes/{id}"
	fwd := s.forward
	return []route{
		{"GET", "/v1/health", s.handleHealth, true},
		{"POST", "/v1/sandboxes", s.handleCreate, false},
		{"GET", "/v1/sandboxes", s.handleList, false},
		{"GET", sb, s.handleGet, false},
		{"DELETE", sb, s.handleDelete, false},
		{"POST", sb + "/pause", s.metrics.timeOp(opPause, s.handlePause), false},
		{"POST", sb + "/suspend", s.handleSuspend, false},
		{"POST", sb + "/timeout", s.handleSetTimeout, false},
		{"POST", sb + "/snapshots", s.handleCreateSnapshot, false},
		{"POST", sb + "/restore", s.metrics.timeOp(opRestore, s.handleRestore), false},
		{"GET", sb + "/checkpoints", s.handleListCheckpoints, false},
		{"POST", sb + "/checkpoints", s.handleCreateCheckpoint, false},
		{"PUT", sb + "/checkpoints/policy", s.handleSetCheckpointPolicy, false},
		{"POST", sb + "/fork", s.metrics.timeOp(opFork, s.handleFork), false},
		{"GET", "/v1/snapshots", s.handleListSnapshots, false},
		{"GET", "/v1/snapshots/{sid}", s.handleGetSnapshot, false},
		{"DELETE", "/v1/snapshots/{sid}", s.handleDeleteSnapshot, false},
		{"POST", sb + "/resume", s.metrics.timeOp(opResume, s.handleResume), false},
		{"POST", sb + "/exec", fwd, false},
		{"GET", sb + "/exec/ws", fwd, false},
		{"GET", sb + "/processes", fwd, false},
		{"GET", sb + "/processes/{pid}", fwd, false},
		{"GET", sb + "/processes/{pid}/output", fwd, false},
		{"GET", sb + "/processes/{pid}/attach", fwd, false},
		{"POST", sb + "/processes/{pid}/signal", fwd, false},
		{"POST", sb + "/processes/{pid}/stdin", fwd, false},
		{"POST", sb + "/processes/{pid}/resize", fwd, false},
		{"GET", sb + "/files", fwd, false},
		{"PUT", sb + "/files", fwd, false},
		{"DELETE", sb + "/files", fwd, false},
		{"GET", sb + "/files/list", fwd, false},
		{"GET", sb + "/files/stat", fwd, false},
		{"POST", sb + "/files/mkdir", fwd, false},
		{"POST", sb + "/files/move", fwd, false},
		{"GET", sb + "/files/watch", fwd, false},
		{"GET", sb + "/files/upload", fwd, false},
		{"DELETE", sb + "/files/upload", fwd, false},
		{"GET", sb + "/files/tar", fwd, false},
		{"PUT", sb + "/files/tar", fwd, false},
		{"GET", sb + "/ports/{port}", fwd, false},
		{"PUT", sb + "/network", s.handleSetNetwork, false},
		{"PUT", sb + "/secrets", s.handleSetSecrets, false},
		{"GET", sb + "/ports/{port}/http/{path...}", fwd, false},
		{"POST", sb + "/ports/{port}/http/{path...}", fwd, false},
		{"PUT", sb + "/ports/{port}/http/{path...}", fwd, false},
		{"PATCH", sb + "/ports/{port}/http/{path...}", fwd, false},
		{"DELETE", sb + "/ports/{port}/http/{path...}", fwd, false},
		{"GET", sb + "/egress", s.handleEgressLog, false},
		{"GET", sb + "/metrics", s.handleMetrics, false},
		{"GET", sb + "/events", s.handleSandboxEvents, false},
		{"GET", "/v1/events", s.handleEvents, false},
		{"GET", "/v1/metrics", s.handleTeamMetrics, false},
		{"POST", "/v1/templates", s.handleBuildTemplate, false},
		{"GET", "/v1/templates", s.handleListTemplates, false},
		{"GET", "/v1/templates/{name}", s.handleGetTemplate, false},
		{"DELETE", "/v1/templates/{name}", s.handleDeleteTemplate, false},
		{"POST", "/v1/apikeys", s.handleCreateKey, false},
		{"GET", "/v1/apikeys", s.handleListKeys, false},
		{"DELETE", "/v1/apikeys/{id}", s.handleDeleteKey, false},
		{"POST", "/v1/secrets", s.handleCreateSecret, false},
		{"GET", "/v1/secrets", s.handleListSecrets, false},
		{"DELETE", "/v1/secrets/{name}", s.handleDeleteSecret, false},
		{"POST", "/v1/webhooks", s.handleCreateWebhook, false},
		{"GET", "/v1/webhooks", s.handleListWebhooks, false},
		{"GET", "/v1/webhooks/{wid}", s.handleGetWebhook, false},
		{"PATCH", "/v1/webhooks/{wid}", s.handleUpdateWebhook, false},
		{"DELETE", "/v1/webhooks/{wid}", s.handleDeleteWebhook, false},
		{"GET", "/v1/webhooks/{wid}/deliveries", s.handleWebhookDeliveries, false},
		{"POST", "/v1/webhooks/{wid}/test", s.handleTestWebhook, false},
		{"GET", "/v1/quota", s.handleQuota, false},
		{"PUT", "/v1/quota", s.handleSetQuota, false},
		{"POST", "/v1/workers", s.handleRegister, true}, // worker token, checked by the handler
		{"GET", "/v1/workers", s.handleListWorkers, false},
		{"GET", "/v1/audit", s.handleAudit, false},
	}
}

// Routes returns "METHOD /path" of every public route, sorted, with a
// wildcard that spans segments ("{path...}") written as OpenAPI writes
// it ("{path}").
func (s *Server) Routes() []string {
	var out []string
	for _, rt := range s.routes() {
		out = append(out, rt.method+" "+strings.ReplaceAll(rt.path, "...}", "}"))
	}
	sort.Strings(out)
	return out
}

// Handler returns the public API. Every request is counted and timed
// (metrics.go) by its route's template, never its path, and gets a
// request ID (package origin) answered in X-Request-Id; every call that
// changes something or is refused is recorded in the audit log
// (audit.go).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	allowed := map[string][]string{} // path -> methods
	for _, rt := range s.routes() {
		h := rt.handler
		if !rt.public {
			h = s.authenticate(h)
		}
		h = s.auditor.wrap(rt.path, rt.method, rt.public, h)
		mux.HandleFunc(rt.method+" "+rt.path, s.metrics.instrument(rt.path, rt.method, h))
		allowed[rt.path] = append(allowed[rt.path], rt.method)
	}
	for path, methods := range allowed {
		allow := strings.Join(methods, ", ")
		mux.HandleFunc(path, s.metrics.instrument(path, "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			httpapi.WriteJSON(w, http.StatusMethodNotAllowed, api.Error{Error: api.ErrorBody{
				Code: api.CodeInvalidArgument, Message: fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, path, allow)}})
		})))
	}
	mux.HandleFunc("/", s.metrics.instrument(routeOther, "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, errkind.NotFound))
	})))
	if s.plane == nil {
		return origin.Middleware(mux)
	}
	plane := s.metrics.instrument(routeDataPlane, "", s.auditedPlane())
	// A data-plane token is served without the database: the sandbox
	// and its worker are in the token.
	return origin.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dataplane.HasToken(r) {
			plane(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	}))
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	httpapi.WriteJSON(w, http.StatusOK, api.Health{Status: "ok", Version: s.cfg.Version})
}

package workerproto

import (
	"context"

	"io"
	"log/slog"
	"net/http"
	"space/api"
	"time"
)

// Service is what a worker does for the control plane: every verb is
// one of its methods. The worker (*worker.Worker) implements it; so does
// [Client], which calls one. Errors wrap errkind kinds.
type Service interface {
	Inspector
	Lifecycle
	Snapshotter
	Egress
	Fencer
}

// Fencer takes the leader's lease: the right to run and serve its
// sandboxes for a while, under a fencing epoch. See LeaseRequest.
type Fencer interface {
	// Lease grants the worker req.TTLMS more, once it has removed the
	// sandboxes a newer epoch took from it; an epoch older than the
	// worker's is a Conflict error.
	Lease(ctx context.Context, req LeaseRequest) (LeaseReply, error)
}

// Inspector reports on the worker and its sandboxes and snapshots.
type Inspector interface {
	Status(ctx context.Context) (Status, error)
	// Sandbox returns the sandbox's info, or a NotFound error.
	Sandbox(ctx context.Context, id string) (Info, error)
	// List returns every sandbox of the worker's, ordered by ID.
	List(ctx context.Context) ([]Info, error)
	// SnapshotInfo returns the worker's snapshot, or a NotFound error.
	SnapshotInfo(ctx context.Context, snapshotID string) (SnapshotInfo, error)
	// Usage returns the sandbox's usage history between req.Start and
	// req.End, or a NotFound error.
	Usage(ctx context.Context, id string, req UsageRequest) (api.SandboxMetrics, error)
}

// Lifecycle creates, pauses, resumes and deletes sandboxes.
type Lifecycle interface {
	// Create boots the sandbox or restores it from a snapshot
	// (req.FromSnapshot) and returns once its agent answers.
	Create(ctx context.Context, req CreateRequest) (Info, error)
	// Pause and Resume stop and restart the sandbox's vCPUs; each is a
	// no-op for a sandbox already so.
	Pause(ctx context.Context, id string) (Info, error)
	Resume(ctx context.Context, id string) (Info, error)
	// Delete stops the sandbox's VM and removes everything of it; a
	// sandbox the worker does not have is a NotFound error.
	Delete(ctx context.Context, id string) error
}

// Snapshotter snapshots sandboxes and restores them.
type Snapshotter interface {
	// Snapshot takes a live snapshot of the sandbox.
	Snapshot(ctx context.Context, id string, req SnapshotRequest) (SnapshotInfo, error)
	// Restore rolls the sandbox back to a snapshot, in place.
	Restore(ctx context.Context, id, snapshotID string) (Info, error)
	// DeleteSnapshot removes the worker's copy of a snapshot.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
}

// Egress sets what a sandbox may reach and reports what it tried.
type Egress interface {
	// SetNetwork replaces a running sandbox's egress policy.
	SetNetwork(ctx context.Context, id string, n Network) (Info, error)
	// SetSecrets replaces a running sandbox's grants and the policy that
	// goes with them.
	SetSecrets(ctx context.Context, id string, req SecretsRequest) (Info, error)
	// EgressLog opens the sandbox's audit of egress decisions (JSON
	// lines) and names it: logID is unique to the worker's run of the
	// sandbox. The caller closes rc.
	EgressLog(ctx context.Context, id string) (logID string, rc io.ReadCloser, err error)
}

// Def is the wire definition of a verb.
type Def struct {
	// Name is the verb's [Service] method; Config.Timeouts is keyed by it.
	Name string
	// Method and Path route the verb: Path is below PathPrefix, a
	// ServeMux pattern whose one wildcard, if any, is {id} (the sandbox,
	// or for snapshot verbs the snapshot).
	Method, Path string
	// Timeout is the verb's deadline, for each call as a whole (retries
	// included) unless the caller's context ends sooner.
	Timeout time.Duration
	// Idempotent says a second identical call leaves the worker as the
	// first did, so a call that failed in transport may be sent again.
	Idempotent bool
	// Code is the HTTP status of a successful answer.
	Code int
}

// None is the request or response of a verb that has no body.
type None struct{}

// Verb is a verb of request Req and response Resp: its definition, and
// how a Service serves it.
type Verb[Req, Resp any] struct {
	Def
	serve func(ctx context.Context, s Service, id string, req Req) (Resp, error)
}

// Deadlines. A TCG boot takes seconds and a cold restore fetches a
// snapshot from the chunk store first; storing a snapshot in the chunk
// store reads all of the guest's memory and disk.
const (
	inspectTimeout = 5 * time.Second
	createTimeout  = 10 * time.Minute
	restoreTimeout = 10 * time.Minute
	storeTimeout   = 15 * time.Minute
	deleteTimeout  = 45 * time.Second
	pauseTimeout   = 30 * time.Second
	policyTimeout  = 15 * time.Second
	secretsTimeout = 30 * time.Second
	logTimeout     = time.Minute
	// leaseTimeout covers removing the sandboxes a new epoch took away.
	leaseTimeout = time.Minute
)

var (
	statusVerb = Verb[None, Status]{
		Def{"Status", http.MethodGet, "/status", inspectTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, _ string, _ None) (Status, error) { return s.Status(ctx) },
	}
	listVerb = Verb[None, []Info]{
		Def{"List", http.MethodGet, "/sandboxes", 2 * inspectTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, _ string, _ None) ([]Info, error) { return s.List(ctx) },
	}
	sandboxVerb = Verb[None, Info]{
		Def{"Sandbox", http.MethodGet, "/sandboxes/{id}", inspectTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, _ None) (Info, error) { return s.Sandbox(ctx, id) },
	}
	snapshotInfoVerb = Verb[None, SnapshotInfo]{
		Def{"SnapshotInfo", http.MethodGet, "/snapshots/{id}", inspectTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, _ None) (SnapshotInfo, error) {
			return s.SnapshotInfo(ctx, id)
		},
	}
	// Usage is a read; its range travels in the body, hence POST.
	usageVerb = Verb[UsageRequest, api.SandboxMetrics]{
		Def{"Usage", http.MethodPost, "/sandboxes/{id}/usage", inspectTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, req UsageRequest) (api.SandboxMetrics, error) {
			return s.Usage(ctx, id, req)
		},
	}
	// Create is not idempotent: a second create of the same ID is a
	// Conflict, even when the first one succeeded.
	createVerb = Verb[CreateRequest, Info]{
		Def{"Create", http.MethodPost, "/sandboxes", createTimeout, false, http.StatusCreated},
		func(ctx context.Context, s Service, _ string, req CreateRequest) (Info, error) {
			return s.Create(ctx, req)
		},
	}
	pauseVerb = Verb[None, Info]{
		Def{"Pause", http.MethodPost, "/sandboxes/{id}/pause", pauseTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, _ None) (Info, error) { return s.Pause(ctx, id) },
	}
	resumeVerb = Verb[None, Info]{
		Def{"Resume", http.MethodPost, "/sandboxes/{id}/resume", pauseTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, _ None) (Info, error) { return s.Resume(ctx, id) },
	}
	// Delete is idempotent: a repeat finds the sandbox gone (NotFound),
	// which callers take as done.
	deleteVerb = Verb[None, None]{
		Def{"Delete", http.MethodDelete, "/sandboxes/{id}", deleteTimeout, true, http.StatusNoContent},
		func(ctx context.Context, s Service, id string, _ None) (None, error) {
			return None{}, s.Delete(ctx, id)
		},
	}
	// Snapshot is not idempotent: a second snapshot of the same ID is a
	// Conflict.
	snapshotVerb = Verb[SnapshotRequest, SnapshotInfo]{
		Def{"Snapshot", http.MethodPost, "/sandboxes/{id}/snapshots", storeTimeout, false, http.StatusCreated},
		func(ctx context.Context, s Service, id string, req SnapshotRequest) (SnapshotInfo, error) {
			return s.Snapshot(ctx, id, req)
		},
	}
	// Restore is not retried: it replaces the running VM, and a repeat
	// would do it again.
	restoreVerb = Verb[RestoreRequest, Info]{
		Def{"Restore", http.MethodPost, "/sandboxes/{id}/restore", restoreTimeout, false, http.StatusOK},
		func(ctx context.Context, s Service, id string, req RestoreRequest) (Info, error) {
			return s.Restore(ctx, id, req.SnapshotID)
		},
	}
	deleteSnapshotVerb = Verb[None, None]{
		Def{"DeleteSnapshot", http.MethodDelete, "/snapshots/{id}", deleteTimeout, true, http.StatusNoContent},
		func(ctx context.Context, s Service, id string, _ None) (None, error) {
			return None{}, s.DeleteSnapshot(ctx, id)
		},
	}
	setNetworkVerb = Verb[Network, Info]{
		Def{"SetNetwork", http.MethodPut, "/sandboxes/{id}/network", policyTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, n Network) (Info, error) {
			return s.SetNetwork(ctx, id, n)
		},
	}
	setSecretsVerb = Verb[SecretsRequest, Info]{
		Def{"SetSecrets", http.MethodPut, "/sandboxes/{id}/secrets", secretsTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, req SecretsRequest) (Info, error) {
			return s.SetSecrets(ctx, id, req)
		},
	}
	// EgressLog streams: its answer is the log itself, with the log's
	// name in EgressLogHeader. Its deadline covers reading it (the log
	// is bounded).
	// Lease is idempotent: a repeat grants the same lease again, and
	// finds the sandboxes a new epoch removes gone.
	leaseVerb = Verb[LeaseRequest, LeaseReply]{
		Def{"Lease", http.MethodPost, "/lease", leaseTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, _ string, req LeaseRequest) (LeaseReply, error) {
			return s.Lease(ctx, req)
		},
	}
	egressLogVerb = Verb[None, EgressLog]{
		Def{"EgressLog", http.MethodGet, "/sandboxes/{id}/egress", logTimeout, true, http.StatusOK},
		func(ctx context.Context, s Service, id string, _ None) (EgressLog, error) {
			logID, rc, err := s.EgressLog(ctx, id)
			return EgressLog{ID: logID, Body: rc}, err
		},
	}
)

// UsageRequest is the range of a Usage call; a zero time leaves its side
// open.
type UsageRequest struct {
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
}

// EgressLog is the answer of the EgressLog verb.
type EgressLog struct {
	ID   string
	Body io.ReadCloser
}

// route is a verb of any types, as Mount and the tests use it.
type route interface {
	def() Def
	handler(s Service, log *slog.Logger) http.HandlerFunc
}

func (v *Verb[Req, Resp]) def() Def { return v.Def }

// verbs is every verb, each once.
var verbs = []route{
	&statusVerb, &listVerb, &sandboxVerb, &snapshotInfoVerb,
	&createVerb, &pauseVerb, &resumeVerb, &deleteVerb,
	&snapshotVerb, &restoreVerb, &deleteSnapshotVerb,
	&setNetworkVerb, &setSecretsVerb, &egressLogVerb, &leaseVerb,
	&usageVerb,
}

// Defs returns the definitions of every verb.
func Defs() []Def {
	out := make([]Def, len(verbs))
	for i, v := range verbs {
		out[i] = v.def()
	}
	return out
}

package controlplane

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"space/api"
	"space/internal/dataplane"
	"space/internal/errkind"
	"space/internal/sandbox"
	"space/internal/store"
	"space/internal/workerproto"
)

// DefaultDataPlaneTTL is how long a data-plane token is valid unless
// configured otherwise.
const DefaultDataPlaneTTL = 15 * time.Minute

// dataPlaneOf returns where sb's data-plane requests go, with a fresh
// token, or nil when its VM does not run or this server makes no tokens.
// A sandbox on a standalone worker is served by Config.DataPlaneURL (a
// `space proxy`, or this server when empty); one on this process's own
// worker only by this server, which alone reaches that worker.
func (s *Server) dataPlaneOf(sb store.Sandbox) *api.DataPlane {
	if s.sealer == nil || sb.WorkerID == "" || (sb.State != sandbox.Running && sb.State != sandbox.Paused) {
		return nil
	}
	g := dataplane.Grant{Sandbox: sb.ID, Team: sb.TeamID, Worker: sb.WorkerID, Expires: s.now().Add(s.cfg.DataPlaneTTL)}
	url := ""
	if rm, ok := s.remote(sb.WorkerID); ok {
		g.Address, url = rm.base.String(), s.cfg.DataPlaneURL
	}
	tok, err := s.sealer.Seal(g)
	if err != nil {
		s.log.Error("seal data-plane token", "sandbox_id", sb.ID, "err", err)
		return nil
	}
	return &api.DataPlane{URL: url, Token: tok, ExpiresAt: g.Expires.UTC()}
}

// remote returns the worker id if it is a standalone one.
func (s *Server) remote(id string) (*Remote, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rm, ok := s.workers[id].(*Remote)
	return rm, ok
}

// planeWorkers is how this server's data plane reaches the worker a
// token names: one it knows, or a standalone one at the token's address
// (it registered with another replica).
type planeWorkers struct{ s *Server }

func (p planeWorkers) Forward(g dataplane.Grant) (http.Handler, error) {
	if wk, err := p.s.worker(g.Worker); err == nil {
		return wk, nil
	}
	if g.Address == "" || p.s.cfg.WorkerToken == "" {
		return nil, fmt.Errorf("worker %s of sandbox %s is not connected to this server: %w", g.Worker, g.Sandbox, errkind.Unavailable)
	}
	return p.s.remotes.Get(g.Worker, g.Address)
}

var _ dataplane.Workers = planeWorkers{}

// Remotes reaches standalone workers by the ID and address a data-plane
// token names, keeping one adapter per worker: what `space proxy` and a
// replica that the worker did not register with forward through. It is
// safe for concurrent use.
type Remotes struct {
	token string // the cluster's worker token

	mu sync.Mutex
	// +checklocks:mu
	byID map[string]*Remote
}

// NewRemotes returns an empty cache of workers reached with token.
func NewRemotes(token string) *Remotes {
	return &Remotes{token: token, byID: map[string]*Remote{}}
}

// Get returns the adapter of worker id at address, making one the first
// time and when the worker moved.
func (rs *Remotes) Get(id, address string) (*Remote, error) {
	token := rs.token
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rm, ok := rs.byID[id]; ok && rm.base.String() == address {
		return rm, nil
	}
	if len(rs.byID) >= maxRemotes {
		clear(rs.byID) // a cache: the workers in use come back at once
	}
	rm, err := NewRemote(id, address, token)
	if err != nil {
		return nil, err
	}
	rs.byID[id] = rm
	return rm, nil
}

// Forward implements dataplane.Workers.
func (rs *Remotes) Forward(g dataplane.Grant) (http.Handler, error) {
	if g.Address == "" {
		return nil, fmt.Errorf("sandbox %s runs on worker %s inside a server; reach it through that server: %w", g.Sandbox, g.Worker, errkind.Unavailable)
	}
	return rs.Get(g.Worker, g.Address)
}

// maxRemotes bounds Remotes: more workers than a cluster has.
const maxRemotes = 4096

// NewDataPlane returns the handler that serves data-plane requests that
// carry tokens of the cluster whose worker token is token, forwarding
// each to the worker it names through workers.
func NewDataPlane(token string, workers dataplane.Workers) (*dataplane.Handler, error) {
	sealer, err := dataplane.NewSealer(token)
	if err != nil {
		return nil, err
	}
	return dataplane.NewHandler(dataplane.Config{Sealer: sealer, Workers: workers, WorkerPrefix: workerproto.PathPrefix, MaxUpload: maxUpload})
}

var _ dataplane.Workers = (*Remotes)(nil)

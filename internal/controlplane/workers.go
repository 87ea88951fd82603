package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"time"

	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/worker"
	"space/internal/workertls"
)

// Worker is how the control plane reaches one worker: lifecycle calls,
// and an HTTP handler that serves the worker API (data-plane requests are
// forwarded to it with their path rewritten under worker.PathPrefix).
type Worker interface {
	ID() string
	Create(ctx context.Context, req worker.CreateRequest) (worker.Info, error)
	Delete(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) (worker.Info, error)
	Snapshot(ctx context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error)
	Restore(ctx context.Context, id, snapID string) (worker.Info, error)
	DeleteSnapshot(ctx context.Context, snapID string) error
	Resume(ctx context.Context, id string) (worker.Info, error)
	SetNetwork(ctx context.Context, id string, n worker.Network) (worker.Info, error)
	// SetSecrets replaces a running sandbox's grants and the policy that
	// goes with them (see worker.Worker.SetSecrets).
	SetSecrets(ctx context.Context, id string, req worker.SecretsRequest) (worker.Info, error)
	// EgressLog opens the sandbox's egress audit log on the worker and
	// names it (see worker.Worker.OpenEgressLog).
	EgressLog(ctx context.Context, id string) (logID string, rc io.ReadCloser, err error)
	Sandbox(ctx context.Context, id string) (worker.Info, error)
	Status(ctx context.Context) (worker.Status, error)
	http.Handler
}

// Local adapts a worker in this process (the embedded worker of `space
// server`).
type Local struct {
	W *worker.Worker
	h http.Handler
}

// NewLocal returns the adapter of an in-process worker.
func NewLocal(w *worker.Worker) *Local { return &Local{W: w, h: w.Handler("")} }

func (l *Local) ID() string { return l.W.ID() }
func (l *Local) Create(ctx context.Context, req worker.CreateRequest) (worker.Info, error) {
	return l.W.CreateWith(ctx, req)
}
func (l *Local) Snapshot(ctx context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error) {
	return l.W.Snapshot(ctx, id, req)
}
func (l *Local) Restore(ctx context.Context, id, snapID string) (worker.Info, error) {
	return l.W.Restore(ctx, id, snapID)
}
func (l *Local) DeleteSnapshot(_ context.Context, snapID string) error {
	return l.W.DeleteSnapshot(snapID)
}
func (l *Local) Delete(ctx context.Context, id string) error { return l.W.Delete(ctx, id) }
func (l *Local) SetNetwork(ctx context.Context, id string, n worker.Network) (worker.Info, error) {
	return l.W.SetNetwork(ctx, id, n)
}
func (l *Local) SetSecrets(ctx context.Context, id string, req worker.SecretsRequest) (worker.Info, error) {
	return l.W.SetSecrets(ctx, id, req)
}
func (l *Local) EgressLog(_ context.Context, id string) (string, io.ReadCloser, error) {
	return l.W.OpenEgressLog(id)
}
func (l *Local) Pause(ctx context.Context, id string) (worker.Info, error) {
	return l.W.Pause(ctx, id)
}
func (l *Local) Resume(ctx context.Context, id string) (worker.Info, error) {
	return l.W.Resume(ctx, id)
}
func (l *Local) Sandbox(_ context.Context, id string) (worker.Info, error) {
	return l.W.Sandbox(id)
}
func (l *Local) Status(context.Context) (worker.Status, error)    { return l.W.Status(), nil }
func (l *Local) ServeHTTP(w http.ResponseWriter, r *http.Request) { l.h.ServeHTTP(w, r) }

// Remote reaches a worker over HTTP (the direct adapter's workers).
type Remote struct {
	id    string
	base  *url.URL
	token string
	hc    *http.Client
	proxy *httputil.ReverseProxy
}

// NewRemote returns the adapter of a worker serving its API at base
// (e.g. https://10.0.0.5:7071), authenticated with token. The worker's
// certificate must be one the token's CA signed (package workertls):
// requests, the token and secret values travel only over that TLS.
func NewRemote(id, base, token string) (*Remote, error) {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("worker %s address %q: want https://host:port (workers serve TLS): %w", id, base, errkind.InvalidArgument)
	}
	tlsCfg, err := workertls.Client(token)
	if err != nil {
		return nil, fmt.Errorf("worker TLS: %v: %w", err, errkind.InvalidArgument)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	rm := &Remote{id: id, base: u, token: token, hc: &http.Client{Transport: tr}}
	rm.proxy = &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Header.Set("Authorization", "Bearer "+token)
		},
		FlushInterval: -1, // stream exec output as it comes
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			httpapi.WriteError(w, fmt.Errorf("worker %s: %v: %w", id, err, errkind.Unavailable))
		},
	}
	return rm, nil
}

func (rm *Remote) ID() string { return rm.id }

func (rm *Remote) ServeHTTP(w http.ResponseWriter, r *http.Request) { rm.proxy.ServeHTTP(w, r) }

func (rm *Remote) call(ctx context.Context, method, path string, body, out any) error {
	var rd *bytes.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequestWithContext(ctx, method, rm.base.JoinPath(worker.PathPrefix, path).String(), rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+rm.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := rm.hc.Do(req)
	if err != nil {
		return fmt.Errorf("worker %s: %v: %w", rm.id, err, errkind.Unavailable)
	}
	defer resp.Body.Close()
	if err := httpapi.ResponseError(resp); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("worker %s: decode %s reply: %v: %w", rm.id, path, err, errkind.Unavailable)
	}
	return nil
}

func (rm *Remote) Create(ctx context.Context, req worker.CreateRequest) (worker.Info, error) {
	var inf worker.Info
	return inf, rm.call(ctx, http.MethodPost, "/sandboxes", req, &inf)
}
func (rm *Remote) Delete(ctx context.Context, id string) error {
	return rm.call(ctx, http.MethodDelete, "/sandboxes/"+id, nil, nil)
}
func (rm *Remote) Snapshot(ctx context.Context, id string, req worker.SnapshotRequest) (worker.SnapshotInfo, error) {
	var info worker.SnapshotInfo
	return info, rm.call(ctx, http.MethodPost, "/sandboxes/"+id+"/snapshots", req, &info)
}
func (rm *Remote) Restore(ctx context.Context, id, snapID string) (worker.Info, error) {
	var inf worker.Info
	return inf, rm.call(ctx, http.MethodPost, "/sandboxes/"+id+"/restore", worker.SnapshotRequest{SnapshotID: snapID}, &inf)
}
func (rm *Remote) DeleteSnapshot(ctx context.Context, snapID string) error {
	return rm.call(ctx, http.MethodDelete, "/snapshots/"+snapID, nil, nil)
}
func (rm *Remote) Pause(ctx context.Context, id string) (worker.Info, error) {
	var inf worker.Info
	return inf, rm.call(ctx, http.MethodPost, "/sandboxes/"+id+"/pause", nil, &inf)
}
func (rm *Remote) Resume(ctx context.Context, id string) (worker.Info, error) {
	var inf worker.Info
	return inf, rm.call(ctx, http.MethodPost, "/sandboxes/"+id+"/resume", nil, &inf)
}
func (rm *Remote) SetNetwork(ctx context.Context, id string, n worker.Network) (worker.Info, error) {
	var inf worker.Info
	return inf, rm.call(ctx, http.MethodPut, "/sandboxes/"+id+"/network", n, &inf)
}
func (rm *Remote) SetSecrets(ctx context.Context, id string, req worker.SecretsRequest) (worker.Info, error) {
	var inf worker.Info
	return inf, rm.call(ctx, http.MethodPut, "/sandboxes/"+id+"/secrets", req, &inf)
}
func (rm *Remote) EgressLog(ctx context.Context, id string) (string, io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rm.base.JoinPath(worker.PathPrefix, "/sandboxes/"+id+"/egress").String(), nil)
	if err != nil {
		return "", nil, err
	}
	req.Header.Set("Authorization", "Bearer "+rm.token)
	resp, err := rm.hc.Do(req)
	if err != nil {
		return "", nil, fmt.Errorf("worker %s: %v: %w", rm.id, err, errkind.Unavailable)
	}
	if err := httpapi.ResponseError(resp); err != nil {
		resp.Body.Close()
		return "", nil, err
	}
	return resp.Header.Get(worker.EgressLogHeader), resp.Body, nil
}
func (rm *Remote) Sandbox(ctx context.Context, id string) (worker.Info, error) {
	var inf worker.Info
	return inf, rm.call(ctx, http.MethodGet, "/sandboxes/"+id, nil, &inf)
}
func (rm *Remote) Status(ctx context.Context) (worker.Status, error) {
	var st worker.Status
	return st, rm.call(ctx, http.MethodGet, "/status", nil, &st)
}

// statusTimeout bounds asking a worker for its capacity during placement.
const statusTimeout = 5 * time.Second

// place picks the worker with the most free memory that fits the spec.
func place(ctx context.Context, workers []Worker, spec worker.Spec) (Worker, error) {
	type cand struct {
		w    Worker
		free int64
	}
	var cands []cand
	for _, w := range workers {
		sctx, cancel := context.WithTimeout(ctx, statusTimeout)
		st, err := w.Status(sctx)
		cancel()
		if err != nil {
			continue // unreachable workers take nothing
		}
		if st.VCPUs-st.UsedVCPUs >= spec.VCPUs && st.MemoryMiB-st.UsedMemoryMiB >= spec.MemoryMiB {
			cands = append(cands, cand{w, st.MemoryMiB - st.UsedMemoryMiB})
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("no worker has %d vcpus and %d MiB free: %w", spec.VCPUs, spec.MemoryMiB, errkind.Unavailable)
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].free > cands[j].free })
	return cands[0].w, nil
}

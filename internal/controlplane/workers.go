package controlplane

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"space/internal/errkind"
	"space/internal/httpapi"
	"space/internal/worker"
	"space/internal/workerproto"
	"space/internal/workertls"
)

// Worker is how the control plane reaches one worker: the worker
// protocol's verbs, each under its deadline (workerproto.Client), and an
// HTTP handler that serves the worker API (data-plane requests are
// forwarded to it with their path rewritten below
// workerproto.DataPattern).
type Worker interface {
	ID() string
	workerproto.Service
	http.Handler
}

// Local adapts a worker in this process (the embedded worker of `space
// server`): its verbs are the worker's own methods, called under the
// verbs' deadlines.
type Local struct {
	*workerproto.Client
	W *worker.Worker
	h http.Handler
}

// NewLocal returns the adapter of an in-process worker.
func NewLocal(w *worker.Worker) (*Local, error) {
	c, err := workerproto.NewLocal(w, workerproto.Config{ID: w.ID()})
	if err != nil {
		return nil, err
	}
	return &Local{Client: c, W: w, h: w.Handler("")}, nil
}

func (l *Local) ServeHTTP(w http.ResponseWriter, r *http.Request) { l.h.ServeHTTP(w, r) }

// Remote reaches a worker over HTTPS (the direct adapter's workers).
type Remote struct {
	*workerproto.Client
	base  *url.URL
	proxy *httputil.ReverseProxy

	mu sync.Mutex
	// +checklocks:mu
	protocol int // as the worker last stated it; 0 = not yet
	// +checklocks:mu
	caps *workerproto.Capabilities // or nil until the worker states them
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
	c, err := workerproto.NewClient(workerproto.RemoteConfig{
		Config: workerproto.Config{ID: id}, Base: base, Token: token,
		Transport: workerproto.TransportConfig{TLS: tlsCfg},
	})
	if err != nil {
		return nil, err
	}
	rm := &Remote{Client: c, base: u}
	rm.proxy = &httputil.ReverseProxy{
		// Data-plane requests stream (exec output, file transfers): no
		// deadline on the answer, only on reaching the worker.
		Transport: workerproto.NewTransport(workerproto.TransportConfig{TLS: tlsCfg}),
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			pr.Out.Header.Set("Authorization", "Bearer "+token)
		},
		FlushInterval: -1, // stream exec output as it comes
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// The worker may be lost, and its sandboxes about to be
			// recovered elsewhere (recovery.go): worth asking again.
			w.Header().Set("Retry-After", "2")
			httpapi.WriteError(w, fmt.Errorf("worker %s: %v: %w", id, err, errkind.Unavailable))
		},
	}
	return rm, nil
}

func (rm *Remote) ServeHTTP(w http.ResponseWriter, r *http.Request) { rm.proxy.ServeHTTP(w, r) }

// stated records the protocol version and capabilities the worker
// stated (at registration, or in its status).
func (rm *Remote) stated(protocol int, caps workerproto.Capabilities) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	rm.protocol, rm.caps = protocol, &caps
}

// statement returns what the worker last stated; caps is nil if it has
// not yet.
func (rm *Remote) statement() (protocol int, caps *workerproto.Capabilities) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return rm.protocol, rm.caps
}

// statusTimeout bounds asking a worker for its capacity; the Status
// verb's own deadline is as short.
const statusTimeout = 5 * time.Second

// noRoom is the error of a placement that found no worker with room.
func noRoom(spec workerproto.Spec) error {
	return fmt.Errorf("no worker has %d vcpus, %d MiB of memory and %d MiB of disk free: %w", spec.VCPUs, spec.MemoryMiB, spec.DiskMiB, errkind.Unavailable)
}

// noRoomRunning is noRoom among the workers that run vmm, which took
// snapshot snap.
func noRoomRunning(spec workerproto.Spec, snap string, vmm vmmID) error {
	return fmt.Errorf("no worker running %s (which took snapshot %s) has %d vcpus, %d MiB of memory and %d MiB of disk free: %w",
		vmm, snap, spec.VCPUs, spec.MemoryMiB, spec.DiskMiB, errkind.Unavailable)
}

package controlplane

import (
	"io"
	"net/http"
	"strings"
	"sync"

	"space/internal/workerproto"
)

// workerTransport sends the public API's data-plane requests
// (/v1/sandboxes/{id}/...) straight to a worker's handler, as forward
// does for clients: the control plane's own work (template builds) uses
// the Go client against it without a network hop or an API key.
type workerTransport struct{ wk Worker }

func (t workerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r2 := req.Clone(req.Context())
	tail, ok := strings.CutPrefix(req.URL.Path, "/v1/sandboxes/")
	id, rest, _ := strings.Cut(tail, "/")
	if !ok || id == "" {
		return nil, &http.ProtocolError{ErrorString: "not a data-plane path: " + req.URL.Path}
	}
	if rest != "" {
		rest = "/" + rest
	}
	r2.URL.Path = workerproto.DataPath(id, rest)
	r2.URL.RawPath = ""
	r2.RequestURI = r2.URL.RequestURI()
	if r2.Body == nil {
		r2.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	rw := &pipeResponse{header: http.Header{}, body: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			rw.WriteHeader(http.StatusOK) // a handler that wrote nothing
			pw.Close()
		}()
		t.wk.ServeHTTP(rw, r2)
	}()
	select {
	case <-rw.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status: http.StatusText(rw.code), StatusCode: rw.code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rw.sent, Body: pr, ContentLength: -1, Request: req,
	}, nil
}

// pipeResponse is an http.ResponseWriter whose body streams into a pipe.
type pipeResponse struct {
	header http.Header
	body   *io.PipeWriter
	once   sync.Once
	ready  chan struct{} // closed once the status is known
	code   int
	sent   http.Header // the header as of WriteHeader
}

func (p *pipeResponse) Header() http.Header { return p.header }

func (p *pipeResponse) WriteHeader(code int) {
	p.once.Do(func() {
		p.code, p.sent = code, p.header.Clone()
		close(p.ready)
	})
}

func (p *pipeResponse) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	return p.body.Write(b)
}

// Flush is a no-op: every Write reaches the reader at once.
func (p *pipeResponse) Flush() {}

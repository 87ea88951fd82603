// Package fcapitest provides FakeFirecracker, a fake of Firecracker's API
// server for tests on machines without Firecracker or KVM.
//
// The fake boots nothing. It enforces what the reference records about the
// v1.16.1 API: strict bodies (unknown and too-new fields rejected, required
// fields, Content-Length only, path id = body id, [A-Za-z0-9_] ids), the
// pre-boot/post-boot split, boot path versus snapshot load, pause before
// snapshot, and a process exit on a failed load. It opens the files a real
// Firecracker opens (kernel, drives, log, snapshot files), binds the vsock
// socket, and writes stand-in snapshot files it can load again. Passing it
// proves a request sequence is well-formed, not that a guest would boot.
package fcapitest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"space/internal/vmm/firecracker/fcapi"
)

// Config configures a FakeFirecracker.
type Config struct {
	// Version is the Firecracker version to impersonate; "" = "1.16.1".
	Version string
	// ID is the instance id GET / reports; "" = "anonymous-instance".
	ID string
	// Exit is called after the response has been sent when a real
	// Firecracker would now exit: 1 after a failed snapshot load, 0 after
	// SendCtrlAltDel when CtrlAltDelReboots. nil ignores it.
	Exit func(code int)
	// CtrlAltDelReboots makes SendCtrlAltDel behave like a guest that
	// reboots on it (reboot=k), which ends Firecracker.
	CtrlAltDelReboots bool
	// Record, if set, receives every request before it is handled.
	Record func(Request)
	// Serial is what the guest writes to its console (Firecracker's
	// stdout, Console) once InstanceStart succeeds: "" = nothing.
	Serial string
	// Console receives Serial; RunProcess sets it to its stdout.
	Console io.Writer
}

// Request is one request the fake received.
type Request struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Body   string `json:"body,omitempty"`
}

// maxPayload is Firecracker's default request body limit.
const maxPayload = 51200

// FakeFirecracker implements http.Handler. Serve it on a unix socket.
type FakeFirecracker struct {
	cfg     Config        // +checklocksignore: immutable
	version fcapi.Version // +checklocksignore: immutable

	// vmm serializes requests, as Firecracker's single VMM thread does,
	// and guards the VM state.
	vmm sync.Mutex
	// +checklocks:vmm
	st state

	mu sync.Mutex
	// +checklocks:mu
	requests []Request
}

type phase int

const (
	notStarted phase = iota
	running
	paused
)

var phaseNames = map[phase]string{notStarted: fcapi.StateNotStarted, running: fcapi.StateRunning, paused: fcapi.StatePaused} // +checklocksignore

type state struct {
	phase    phase
	bootPath bool // a boot-specific resource was configured
	metrics  bool
	logFile  *os.File // or nil
	kernel   string   // "" until PUT /boot-source
	bootArgs string
	vcpus    int
	memMiB   int
	dirty    bool // dirty page tracking
	drives   []savedDrive
	nics     []savedNIC
	vsock    *savedVsock
	vsockLn  net.Listener // or nil
	entropy  bool
	balloon  *balloonBody
}

type savedDrive struct {
	ID       string `json:"id"`
	Path     string `json:"path"`
	Root     bool   `json:"root"`
	ReadOnly bool   `json:"read_only"`
}

type savedNIC struct {
	ID  string `json:"id"`
	Tap string `json:"tap"`
	MAC string `json:"mac,omitempty"`
}

type savedVsock struct {
	CID  uint32 `json:"cid"`
	Path string `json:"path"`
}

// vmstate is the fake's snapshot state file.
type vmstate struct {
	Magic    string       `json:"magic"`
	Version  string       `json:"version"`
	VCPUs    int          `json:"vcpus"`
	MemMiB   int          `json:"mem_mib"`
	BootArgs string       `json:"boot_args"`
	Drives   []savedDrive `json:"drives"`
	NICs     []savedNIC   `json:"nics"`
	Vsock    *savedVsock  `json:"vsock,omitempty"`
	Entropy  bool         `json:"entropy"`
}

const vmstateMagic = "fake-firecracker-vmstate"

// New returns a fake in the "Not started" state.
func New(cfg Config) (*FakeFirecracker, error) {
	if cfg.Version == "" {
		cfg.Version = "1.16.1"
	}
	if cfg.ID == "" {
		cfg.ID = "anonymous-instance"
	}
	v, err := fcapi.ParseVersion(cfg.Version)
	if err != nil {
		return nil, err
	}
	return &FakeFirecracker{cfg: cfg, version: v, st: state{vcpus: 1, memMiB: 128}}, nil
}

// Requests returns the requests received so far, in order.
func (f *FakeFirecracker) Requests() []Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Request(nil), f.requests...)
}

// Close releases what the fake holds open: the log file and the vsock
// listener (removing its socket).
func (f *FakeFirecracker) Close() error {
	f.vmm.Lock()
	defer f.vmm.Unlock()
	var errs []error
	if f.st.logFile != nil {
		errs = append(errs, f.st.logFile.Close())
		f.st.logFile = nil
	}
	if f.st.vsockLn != nil {
		errs = append(errs, f.st.vsockLn.Close())
		f.st.vsockLn = nil
	}
	return errors.Join(errs...)
}

type result struct {
	status int
	body   any
	exit   int // -1: keep running
}

func done() result        { return result{status: http.StatusNoContent, exit: -1} }
func answer(v any) result { return result{status: http.StatusOK, body: v, exit: -1} }
func reject(err error) result {
	return result{status: http.StatusBadRequest, body: map[string]string{"fault_message": err.Error()}, exit: -1}
}
func rejectf(format string, args ...any) result { return reject(fmt.Errorf(format, args...)) }

// fatal is a rejection after which Firecracker exits.
func fatal(err error) result {
	r := reject(err)
	r.exit = 1
	return r
}

var (
	errAfterStart  = errors.New("The requested operation is not supported after starting the microVM.")  // +checklocksignore
	errBeforeStart = errors.New("The requested operation is not supported before starting the microVM.") // +checklocksignore
)

// ServeHTTP handles one API request, one at a time.
func (f *FakeFirecracker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r)
	req := Request{Method: r.Method, Path: r.URL.Path, Body: string(body)}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()
	if f.cfg.Record != nil {
		f.cfg.Record(req)
	}
	var res result
	if err != nil {
		res = reject(err)
	} else {
		f.vmm.Lock()
		res = f.handleLocked(r.Method, r.URL.Path, body)
		f.vmm.Unlock()
	}
	// Always a Content-Length, so that a response flushed just before an
	// exit arrives whole.
	if res.body != nil {
		b, _ := json.Marshal(res.body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(res.status)
		w.Write(b)
	} else {
		w.WriteHeader(res.status)
	}
	if res.exit >= 0 && f.cfg.Exit != nil {
		http.NewResponseController(w).Flush()
		f.cfg.Exit(res.exit)
	}
}

// readBody reads the body the way Firecracker's HTTP server does: by
// Content-Length only, so a chunked body counts as empty.
func readBody(r *http.Request) ([]byte, error) {
	chunked := len(r.TransferEncoding) > 0
	if r.Method == http.MethodGet {
		if chunked || r.ContentLength > 0 {
			return nil, errors.New("GET request cannot have a body.")
		}
		return nil, nil
	}
	var b []byte
	if !chunked {
		var err error
		b, err = io.ReadAll(io.LimitReader(r.Body, maxPayload+1))
		if err != nil {
			return nil, err
		}
	}
	if len(b) > maxPayload {
		return nil, fmt.Errorf("Request payload with size %d is larger than the limit of %d allowed by server.", r.ContentLength, maxPayload)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("Empty %s request.", r.Method)
	}
	return b, nil
}

// +checklocks:f.vmm
func (f *FakeFirecracker) handleLocked(method, path string, body []byte) result {
	st := &f.st
	route := method + " " + path
	switch {
	case route == "GET /":
		return answer(fcapi.InstanceInfo{AppName: "Firecracker", ID: f.cfg.ID, State: phaseNames[st.phase], VMMVersion: f.cfg.Version})
	case route == "GET /version":
		return answer(map[string]string{"firecracker_version": f.cfg.Version})
	case route == "GET /machine-config":
		return answer(map[string]any{"vcpu_count": st.vcpus, "mem_size_mib": st.memMiB, "track_dirty_pages": st.dirty})
	case route == "PUT /logger":
		return f.putLoggerLocked(body)
	case route == "PUT /metrics":
		return f.putMetricsLocked(body)
	case route == "PUT /boot-source":
		return f.putBootSourceLocked(body)
	case route == "PUT /machine-config":
		return f.putMachineLocked(body)
	case method == http.MethodPut && strings.HasPrefix(path, "/drives/"):
		return f.putDriveLocked(strings.TrimPrefix(path, "/drives/"), body)
	case method == http.MethodPatch && strings.HasPrefix(path, "/drives/"):
		return f.patchDriveLocked(strings.TrimPrefix(path, "/drives/"), body)
	case method == http.MethodPut && strings.HasPrefix(path, "/network-interfaces/"):
		return f.putNICLocked(strings.TrimPrefix(path, "/network-interfaces/"), body)
	case route == "PUT /vsock":
		return f.putVsockLocked(body)
	case route == "PUT /entropy" && f.version.AtLeast(1, 4):
		return f.putEntropyLocked(body)
	case route == "PUT /balloon", route == "PATCH /balloon", route == "GET /balloon/statistics":
		return f.balloonLocked(method, body)
	case route == "PUT /actions":
		return f.actionLocked(body)
	case route == "PATCH /vm":
		return f.patchVMLocked(body)
	case route == "PUT /snapshot/create":
		return f.createSnapshotLocked(body)
	case route == "PUT /snapshot/load":
		return f.loadSnapshotLocked(body)
	}
	return rejectf("Invalid request method and/or path: %s %s.", method, path)
}

// bootSpecificLocked admits a boot-specific configuration request.
// +checklocks:f.vmm
func (f *FakeFirecracker) bootSpecificLocked() error {
	if f.st.phase != notStarted {
		return errAfterStart
	}
	f.st.bootPath = true
	return nil
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putLoggerLocked(body []byte) result {
	var b loggerBody
	if err := decode(body, "/logger", f.version, &b); err != nil {
		return reject(err)
	}
	if f.st.phase != notStarted {
		return reject(errAfterStart)
	}
	if b.Level != nil {
		switch strings.ToLower(*b.Level) {
		case "error", "warning", "info", "debug", "trace", "off":
		default:
			return rejectf("Invalid level: %s.", *b.Level)
		}
	}
	if b.LogPath == nil {
		return done()
	}
	flags := os.O_RDWR | syscall.O_NONBLOCK
	if f.version.AtLeast(1, 14) {
		flags |= os.O_CREATE
	}
	lf, err := os.OpenFile(*b.LogPath, flags, 0o600)
	if err != nil {
		return rejectf("Failed to open target file: %v", err)
	}
	fmt.Fprintf(lf, "Running Firecracker v%s\n", f.cfg.Version)
	if f.st.logFile != nil {
		f.st.logFile.Close()
	}
	f.st.logFile = lf
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putMetricsLocked(body []byte) result {
	var b metricsBody
	if err := decode(body, "/metrics", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("metrics_path", b.MetricsPath); err != nil {
		return reject(err)
	}
	if f.st.phase != notStarted {
		return reject(errAfterStart)
	}
	if f.st.metrics {
		return rejectf("Reinitialization of metrics not allowed.")
	}
	f.st.metrics = true
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putBootSourceLocked(body []byte) result {
	var b bootSourceBody
	if err := decode(body, "/boot-source", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("kernel_image_path", b.KernelImagePath); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	// Firecracker opens both files when it handles the request.
	for _, p := range []*string{b.KernelImagePath, b.InitrdPath} {
		if p == nil {
			continue
		}
		fl, err := os.Open(*p)
		if err != nil {
			return rejectf("The kernel file cannot be opened: %v", err)
		}
		fl.Close()
	}
	f.st.kernel = *b.KernelImagePath
	f.st.bootArgs = ""
	if b.BootArgs != nil {
		f.st.bootArgs = *b.BootArgs
	}
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putMachineLocked(body []byte) result {
	var b machineBody
	if err := decode(body, "/machine-config", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("vcpu_count", b.VCPUCount, "mem_size_mib", b.MemSizeMiB); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	if *b.VCPUCount < 1 || *b.VCPUCount > 32 {
		return rejectf("The vCPU number is invalid! The vCPU number can only be 1 or an even number when SMT is enabled.")
	}
	if *b.MemSizeMiB < 1 {
		return rejectf("The memory size (MiB) is invalid.")
	}
	f.st.vcpus, f.st.memMiB = *b.VCPUCount, *b.MemSizeMiB
	f.st.dirty = b.TrackDirtyPages != nil && *b.TrackDirtyPages
	return done()
}

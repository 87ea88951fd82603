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

// checkID applies the path id rules: valid characters, and equal to the
// id in the body.
func checkID(pathID string, bodyID *string, field string) error {
	if !idPattern.MatchString(pathID) {
		return fmt.Errorf("Invalid ID: %q. The ID must be alphanumeric (and can contain underscores).", pathID)
	}
	if err := missing(field, bodyID); err != nil {
		return err
	}
	if *bodyID != pathID {
		return errors.New("The id from the path does not match the id from the body!")
	}
	return nil
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putDriveLocked(id string, body []byte) result {
	var b driveBody
	if err := decode(body, "/drives", f.version, &b); err != nil {
		return reject(err)
	}
	if err := checkID(id, b.DriveID, "drive_id"); err != nil {
		return reject(err)
	}
	if err := missing("is_root_device", b.IsRootDevice); err != nil {
		return reject(err)
	}
	if b.Socket != nil {
		return rejectf("the fake does not implement vhost-user drives")
	}
	if err := missing("path_on_host", b.PathOnHost, "is_read_only", b.IsReadOnly); err != nil {
		return reject(err)
	}
	if err := b.RateLimiter.check(); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	if err := openDrive(*b.PathOnHost, *b.IsReadOnly); err != nil {
		return rejectf("Unable to create the block device: %v", err)
	}
	d := savedDrive{ID: id, Path: *b.PathOnHost, Root: *b.IsRootDevice, ReadOnly: *b.IsReadOnly}
	for i, old := range f.st.drives {
		if old.ID == id {
			f.st.drives[i] = d
			return done()
		}
		if old.Root && d.Root {
			return rejectf("A root block device already exists!")
		}
	}
	f.st.drives = append(f.st.drives, d)
	return done()
}

func openDrive(path string, readOnly bool) error {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	fl, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return err
	}
	return fl.Close()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) patchDriveLocked(id string, body []byte) result {
	var b drivePatchBody
	if err := decode(body, "/drives", f.version, &b); err != nil {
		return reject(err)
	}
	if err := checkID(id, b.DriveID, "drive_id"); err != nil {
		return reject(err)
	}
	if f.st.phase == notStarted {
		return reject(errBeforeStart)
	}
	for i, d := range f.st.drives {
		if d.ID != id {
			continue
		}
		if b.PathOnHost != nil {
			if err := openDrive(*b.PathOnHost, d.ReadOnly); err != nil {
				return rejectf("Unable to patch the block device: %v", err)
			}
			f.st.drives[i].Path = *b.PathOnHost
		}
		return done()
	}
	return rejectf("Invalid block device ID: %s.", id)
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putNICLocked(id string, body []byte) result {
	var b nicBody
	if err := decode(body, "/network-interfaces", f.version, &b); err != nil {
		return reject(err)
	}
	if err := checkID(id, b.IfaceID, "iface_id"); err != nil {
		return reject(err)
	}
	if err := missing("host_dev_name", b.HostDevName); err != nil {
		return reject(err)
	}
	if b.GuestMAC != nil && !macPattern.MatchString(*b.GuestMAC) {
		return rejectf("Invalid MAC address: %s.", *b.GuestMAC)
	}
	if b.MTU != nil && (*b.MTU < 68 || *b.MTU > 65535) {
		return rejectf("Invalid MTU: %d.", *b.MTU)
	}
	if err := errors.Join(b.RxRateLimiter.check(), b.TxRateLimiter.check()); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	n := savedNIC{ID: id, Tap: *b.HostDevName}
	if b.GuestMAC != nil {
		n.MAC = *b.GuestMAC
	}
	for i, old := range f.st.nics {
		if old.ID == id {
			f.st.nics[i] = n
			return done()
		}
		if old.Tap == n.Tap {
			return rejectf("The host device name %s is already in use.", n.Tap)
		}
	}
	f.st.nics = append(f.st.nics, n)
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putVsockLocked(body []byte) result {
	var b vsockBody
	if err := decode(body, "/vsock", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("guest_cid", b.GuestCID, "uds_path", b.UDSPath); err != nil {
		return reject(err)
	}
	if *b.GuestCID < 3 {
		return rejectf("Invalid guest CID: %d.", *b.GuestCID)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	if err := f.bindVsockLocked(*b.UDSPath); err != nil {
		return rejectf("Cannot create backend for vsock device: %v", err)
	}
	f.st.vsock = &savedVsock{CID: *b.GuestCID, Path: *b.UDSPath}
	return done()
}

// bindVsockLocked binds the vsock unix socket, replacing an earlier one.
// Connections are closed unanswered, as Firecracker does when no guest
// listens on the requested port.
// +checklocks:f.vmm
func (f *FakeFirecracker) bindVsockLocked(path string) error {
	if f.st.vsockLn != nil {
		f.st.vsockLn.Close()
		f.st.vsockLn = nil
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	f.st.vsockLn = ln
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return nil
}

// +checklocks:f.vmm
func (f *FakeFirecracker) putEntropyLocked(body []byte) result {
	var b entropyBody
	if err := decode(body, "/entropy", f.version, &b); err != nil {
		return reject(err)
	}
	if err := b.RateLimiter.check(); err != nil {
		return reject(err)
	}
	if err := f.bootSpecificLocked(); err != nil {
		return reject(err)
	}
	f.st.entropy = true
	return done()
}

// +checklocks:f.vmm
func (f *FakeFirecracker) balloonLocked(method string, body []byte) result {
	switch method {
	case http.MethodPut:
		var b balloonBody
		if err := decode(body, "/balloon", f.version, &b); err != nil {
			return reject(err)
		}
		if err := missing("amount_mib", b.AmountMiB, "deflate_on_oom", b.DeflateOnOOM); err != nil {
			return reject(err)
		}
		if err := f.bootSpecificLocked(); err != nil {
			return reject(err)
		}
		f.st.balloon = &b
		return done()
	case http.MethodPatch:
		var b balloonPatchBody
		if err := decode(body, "/balloon", f.version, &b); err != nil {
			return reject(err)
		}
		if err := missing("amount_mib", b.AmountMiB); err != nil {
			return reject(err)
		}
		if f.st.phase == notStarted {
			return reject(errBeforeStart)
		}
		if f.st.balloon == nil {
			return rejectf("No balloon device found.")
		}
		f.st.balloon.AmountMiB = b.AmountMiB
		return done()
	}
	if f.st.phase == notStarted {
		return reject(errBeforeStart)
	}
	if f.st.balloon == nil || f.st.balloon.StatsPollingIntervalS == nil || *f.st.balloon.StatsPollingIntervalS == 0 {
		return rejectf("Statistics for the balloon device are not enabled")
	}
	target := int64(*f.st.balloon.AmountMiB)
	return answer(map[string]int64{"target_pages": target * 256, "actual_pages": target * 256, "target_mib": target, "actual_mib": target})
}

// +checklocks:f.vmm
func (f *FakeFirecracker) actionLocked(body []byte) result {
	var b actionBody
	if err := decode(body, "/actions", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("action_type", b.ActionType); err != nil {
		return reject(err)
	}
	switch *b.ActionType {
	case "InstanceStart":
		if f.st.phase != notStarted {
			return reject(errAfterStart)
		}
		if f.st.kernel == "" {
			return rejectf("Cannot start microvm without kernel configuration.")
		}
		f.st.phase = running
		return done()
	case "FlushMetrics":
		if f.st.phase == notStarted {
			return reject(errBeforeStart)
		}
		return done()
	case "SendCtrlAltDel":
		if f.st.phase == notStarted {
			return reject(errBeforeStart)
		}
		r := done()
		if f.cfg.CtrlAltDelReboots && f.st.phase == running {
			r.exit = 0
		}
		return r
	}
	return rejectf("An error occurred when deserializing the json body of a request: unknown variant `%s`.", *b.ActionType)
}

// +checklocks:f.vmm
func (f *FakeFirecracker) patchVMLocked(body []byte) result {
	var b vmBody
	if err := decode(body, "/vm", f.version, &b); err != nil {
		return reject(err)
	}
	if err := missing("state", b.State); err != nil {
		return reject(err)
	}
	if f.st.phase == notStarted {
		return reject(errBeforeStart)
	}
	switch *b.State {
	case "Paused":
		f.st.phase = paused
	case "Resumed":
		f.st.phase = running
	default:
		return rejectf("An error occurred when deserializing the json body of a request: unknown variant `%s`.", *b.State)
	}
	return done()
}

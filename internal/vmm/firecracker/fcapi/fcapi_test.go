package fcapi_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/vmm/firecracker/fcapi"
	"space/internal/vmm/firecracker/fcapi/fcapitest"
)

// rawRequest is what a recording server saw.
type rawRequest struct {
	Method           string
	Path             string
	ContentLength    int64
	TransferEncoding []string
	ContentType      string
	Body             string
}

// serveUnix serves h on a unix socket in a short temporary directory and
// returns the socket's path.
func serveUnix(t *testing.T, h http.Handler) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fcapi")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// recorder answers 204 to everything and records the raw requests.
type recorder struct {
	mu sync.Mutex
	// +checklocks:mu
	reqs []rawRequest
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.reqs = append(r.reqs, rawRequest{req.Method, req.URL.Path, req.ContentLength, req.TransferEncoding, req.Header.Get("Content-Type"), string(b)})
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

func (r *recorder) last() rawRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[len(r.reqs)-1]
}

func TestRequestBodies(t *testing.T) {
	rec := &recorder{}
	c := fcapi.New(serveUnix(t, rec))
	defer c.Close()
	tb := &fcapi.TokenBucket{Size: 1000, RefillTime: 100}
	tests := []struct {
		name       string
		call       func(context.Context) error
		wantMethod string
		wantPath   string
		wantBody   string
	}{
		{"logger", func(ctx context.Context) error {
			return c.PutLogger(ctx, fcapi.Logger{LogPath: "vmm.fifo", Level: "Info", ShowLevel: true})
		}, "PUT", "/logger", `{"log_path":"vmm.fifo","level":"Info","show_level":true}`},
		{"logger zero", func(ctx context.Context) error { return c.PutLogger(ctx, fcapi.Logger{}) }, "PUT", "/logger", `{}`},
		{"metrics", func(ctx context.Context) error { return c.PutMetrics(ctx, fcapi.Metrics{MetricsPath: "m.fifo"}) },
			"PUT", "/metrics", `{"metrics_path":"m.fifo"}`},
		{"boot source", func(ctx context.Context) error {
			return c.PutBootSource(ctx, fcapi.BootSource{KernelImagePath: "/k", InitrdPath: "/i", BootArgs: "console=ttyS0"})
		}, "PUT", "/boot-source", `{"kernel_image_path":"/k","boot_args":"console=ttyS0","initrd_path":"/i"}`},
		{"boot source minimal", func(ctx context.Context) error { return c.PutBootSource(ctx, fcapi.BootSource{KernelImagePath: "/k"}) },
			"PUT", "/boot-source", `{"kernel_image_path":"/k"}`},
		{"drive", func(ctx context.Context) error {
			return c.PutDrive(ctx, fcapi.Drive{DriveID: "d0", PathOnHost: "d0", IsReadOnly: true})
		}, "PUT", "/drives/d0", `{"drive_id":"d0","path_on_host":"d0","is_root_device":false,"is_read_only":true}`},
		{"drive with limiter", func(ctx context.Context) error {
			return c.PutDrive(ctx, fcapi.Drive{DriveID: "rootfs", PathOnHost: "/r", IsRootDevice: true, CacheType: "Writeback", RateLimiter: &fcapi.RateLimiter{Ops: tb}})
		}, "PUT", "/drives/rootfs", `{"drive_id":"rootfs","path_on_host":"/r","is_root_device":true,"is_read_only":false,"cache_type":"Writeback","rate_limiter":{"ops":{"size":1000,"refill_time":100}}}`},
		{"patch drive", func(ctx context.Context) error {
			return c.PatchDrive(ctx, fcapi.DriveUpdate{DriveID: "d1", PathOnHost: "/new"})
		},
			"PATCH", "/drives/d1", `{"drive_id":"d1","path_on_host":"/new"}`},
		{"machine", func(ctx context.Context) error {
			return c.PutMachineConfig(ctx, fcapi.MachineConfig{VCPUCount: 2, MemSizeMiB: 256})
		},
			"PUT", "/machine-config", `{"vcpu_count":2,"mem_size_mib":256}`},
		{"machine dirty", func(ctx context.Context) error {
			return c.PutMachineConfig(ctx, fcapi.MachineConfig{VCPUCount: 1, MemSizeMiB: 128, TrackDirtyPages: true})
		}, "PUT", "/machine-config", `{"vcpu_count":1,"mem_size_mib":128,"track_dirty_pages":true}`},
		{"nic", func(ctx context.Context) error {
			return c.PutNetworkInterface(ctx, fcapi.NetworkInterface{IfaceID: "eth0", HostDevName: "tap0", GuestMAC: "02:fc:00:00:00:01"})
		}, "PUT", "/network-interfaces/eth0", `{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"02:fc:00:00:00:01"}`},
		{"vsock", func(ctx context.Context) error {
			return c.PutVsock(ctx, fcapi.Vsock{GuestCID: 3, UDSPath: "vsock.sock"})
		},
			"PUT", "/vsock", `{"guest_cid":3,"uds_path":"vsock.sock"}`},
		{"entropy", func(ctx context.Context) error { return c.PutEntropy(ctx, fcapi.Entropy{}) }, "PUT", "/entropy", `{}`},
		{"balloon", func(ctx context.Context) error {
			return c.PutBalloon(ctx, fcapi.Balloon{AmountMiB: 0, DeflateOnOOM: true})
		},
			"PUT", "/balloon", `{"amount_mib":0,"deflate_on_oom":true}`},
		{"patch balloon", func(ctx context.Context) error { return c.PatchBalloon(ctx, fcapi.BalloonUpdate{AmountMiB: 64}) },
			"PATCH", "/balloon", `{"amount_mib":64}`},
		{"start", func(ctx context.Context) error { return c.Action(ctx, fcapi.InstanceStart) },
			"PUT", "/actions", `{"action_type":"InstanceStart"}`},
		{"ctrl alt del", func(ctx context.Context) error { return c.Action(ctx, fcapi.SendCtrlAltDel) },
			"PUT", "/actions", `{"action_type":"SendCtrlAltDel"}`},
		{"flush metrics", func(ctx context.Context) error { return c.Action(ctx, fcapi.FlushMetrics) },
			"PUT", "/actions", `{"action_type":"FlushMetrics"}`},
		{"pause", func(ctx context.Context) error { return c.PatchVM(ctx, fcapi.Paused) }, "PATCH", "/vm", `{"state":"Paused"}`},
		{"resume", func(ctx context.Context) error { return c.PatchVM(ctx, fcapi.Resumed) }, "PATCH", "/vm", `{"state":"Resumed"}`},
		{"snapshot full", func(ctx context.Context) error {
			return c.CreateSnapshot(ctx, fcapi.SnapshotCreate{SnapshotType: fcapi.Full, SnapshotPath: "/s/vmstate", MemFilePath: "/s/memory"})
		}, "PUT", "/snapshot/create", `{"snapshot_type":"Full","snapshot_path":"/s/vmstate","mem_file_path":"/s/memory"}`},
		{"snapshot diff", func(ctx context.Context) error {
			return c.CreateSnapshot(ctx, fcapi.SnapshotCreate{SnapshotType: fcapi.Diff, SnapshotPath: "v", MemFilePath: "m"})
		}, "PUT", "/snapshot/create", `{"snapshot_type":"Diff","snapshot_path":"v","mem_file_path":"m"}`},
		{"load file backend", func(ctx context.Context) error {
			return c.LoadSnapshot(ctx, fcapi.SnapshotLoad{SnapshotPath: "v", MemBackend: &fcapi.MemBackend{BackendType: fcapi.BackendFile, BackendPath: "m"}, ResumeVM: true})
		}, "PUT", "/snapshot/load", `{"snapshot_path":"v","mem_backend":{"backend_type":"File","backend_path":"m"},"resume_vm":true}`},
		{"load tracked with override", func(ctx context.Context) error {
			return c.LoadSnapshot(ctx, fcapi.SnapshotLoad{
				SnapshotPath: "v", MemBackend: &fcapi.MemBackend{BackendType: fcapi.BackendUffd, BackendPath: "uffd.sock"},
				TrackDirtyPages: true, NetworkOverrides: []fcapi.NetworkOverride{{IfaceID: "eth0", HostDevName: "tap9"}},
			})
		}, "PUT", "/snapshot/load", `{"snapshot_path":"v","mem_backend":{"backend_type":"Uffd","backend_path":"uffd.sock"},"track_dirty_pages":true,"network_overrides":[{"iface_id":"eth0","host_dev_name":"tap9"}]}`},
		{"load legacy", func(ctx context.Context) error {
			return c.LoadSnapshot(ctx, fcapi.SnapshotLoad{SnapshotPath: "v", MemFilePath: "m", EnableDiffSnapshots: true})
		}, "PUT", "/snapshot/load", `{"snapshot_path":"v","mem_file_path":"m","enable_diff_snapshots":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(t.Context()); err != nil {
				t.Fatalf("call: %v", err)
			}
			got := rec.last()
			want := rawRequest{
				Method: tt.wantMethod, Path: tt.wantPath, ContentLength: int64(len(tt.wantBody)),
				ContentType: "application/json", Body: tt.wantBody,
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGetsCarryNoBody(t *testing.T) {
	rec := &recorder{}
	c := fcapi.New(serveUnix(t, rec))
	// The recorder's 204 makes the decoding fail; only the request counts.
	c.Instance(t.Context())
	got := rec.last()
	want := rawRequest{Method: "GET", Path: "/"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GET / request (-want +got):\n%s", diff)
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name      string
		status    int
		body      string
		call      func(context.Context, *fcapi.Client) error
		wantFault string
		wantKind  *errkind.Kind
	}{
		{"config rejected", 400, `{"fault_message":"The kernel file cannot be opened"}`,
			func(ctx context.Context, c *fcapi.Client) error {
				return c.PutBootSource(ctx, fcapi.BootSource{KernelImagePath: "k"})
			},
			"The kernel file cannot be opened", errkind.InvalidArgument},
		{"action rejected", 400, `{"fault_message":"The requested operation is not supported before starting the microVM."}`,
			func(ctx context.Context, c *fcapi.Client) error { return c.PatchVM(ctx, fcapi.Paused) },
			"The requested operation is not supported before starting the microVM.", errkind.FailedPrecondition},
		{"payload too large", 413, `{"fault_message":"too big"}`,
			func(ctx context.Context, c *fcapi.Client) error {
				return c.PutMetrics(ctx, fcapi.Metrics{MetricsPath: "m"})
			},
			"too big", errkind.ResourceExhausted},
		{"server error without json", 500, "boom\n",
			func(ctx context.Context, c *fcapi.Client) error { return c.Action(ctx, fcapi.InstanceStart) },
			"boom", errkind.Unavailable},
		{"empty error body", 400, "",
			func(ctx context.Context, c *fcapi.Client) error {
				return c.PutVsock(ctx, fcapi.Vsock{GuestCID: 3, UDSPath: "v"})
			},
			"(no fault message)", errkind.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := serveUnix(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			err := tt.call(t.Context(), fcapi.New(sock))
			var fe *fcapi.Error
			if !errors.As(err, &fe) {
				t.Fatalf("call = %v, want *fcapi.Error", err)
			}
			if fe.Status != tt.status || fe.Fault != tt.wantFault {
				t.Errorf("error = status %d fault %q, want %d %q", fe.Status, fe.Fault, tt.status, tt.wantFault)
			}
			if !errors.Is(err, tt.wantKind) {
				t.Errorf("error kind = %v, want %v", errkind.Of(err), tt.wantKind)
			}
			if !fcapi.IsRejected(err) {
				t.Errorf("IsRejected(%v) = false, want true", err)
			}
		})
	}
}

func TestResponses(t *testing.T) {
	sock := serveUnix(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/":
			io.WriteString(w, `{"app_name":"Firecracker","id":"vm-1","state":"Running","vmm_version":"1.16.1","future_field":1}`)
		case "/version":
			io.WriteString(w, `{"firecracker_version":"1.16.1"}`)
		case "/balloon/statistics":
			io.WriteString(w, `{"target_pages":256,"actual_pages":128,"target_mib":1,"actual_mib":0,"free_memory":4096}`)
		default:
			io.WriteString(w, `{"x":"`+strings.Repeat("a", 2<<20)+`"}`)
		}
	}))
	c := fcapi.New(sock)
	ctx := t.Context()

	info, err := c.Instance(ctx)
	if err != nil {
		t.Fatalf("Instance: %v", err)
	}
	if diff := cmp.Diff(fcapi.InstanceInfo{AppName: "Firecracker", ID: "vm-1", State: fcapi.StateRunning, VMMVersion: "1.16.1"}, info); diff != "" {
		t.Errorf("Instance (-want +got):\n%s", diff)
	}
	if v, err := c.Version(ctx); err != nil || v != "1.16.1" {
		t.Errorf("Version() = %q, %v, want 1.16.1", v, err)
	}
	free := uint64(4096)
	stats, err := c.BalloonStatistics(ctx)
	if err != nil {
		t.Fatalf("BalloonStatistics: %v", err)
	}
	if diff := cmp.Diff(fcapi.BalloonStats{TargetPages: 256, ActualPages: 128, TargetMiB: 1, FreeMemory: &free}, stats); diff != "" {
		t.Errorf("BalloonStatistics (-want +got):\n%s", diff)
	}
}

func TestResponseBodyIsBounded(t *testing.T) {
	sock := serveUnix(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"firecracker_version":"`+strings.Repeat("1", 2<<20)+`"}`)
	}))
	_, err := fcapi.New(sock).Version(t.Context())
	if !errors.Is(err, errkind.Internal) {
		t.Errorf("Version() with a 2 MiB answer = %v, want an internal error", err)
	}
}

func TestTransportErrors(t *testing.T) {
	c := fcapi.New(filepath.Join(t.TempDir(), "missing.sock"))
	err := c.PutEntropy(t.Context(), fcapi.Entropy{})
	if !errors.Is(err, errkind.Unavailable) || fcapi.IsRejected(err) {
		t.Errorf("PutEntropy on a missing socket = %v, want an unavailable error that is not a rejection", err)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	cause := errors.New("test over")
	cancel(cause)
	if err := c.PutEntropy(ctx, fcapi.Entropy{}); !errors.Is(err, cause) {
		t.Errorf("PutEntropy with a cancelled ctx = %v, want its cause", err)
	}
}

func TestClientSideValidation(t *testing.T) {
	rec := &recorder{}
	c := fcapi.New(serveUnix(t, rec))
	ctx := t.Context()
	tests := []struct {
		name string
		call func() error
	}{
		{"drive id with dash", func() error { return c.PutDrive(ctx, fcapi.Drive{DriveID: "d-0", PathOnHost: "x"}) }},
		{"empty drive id", func() error { return c.PatchDrive(ctx, fcapi.DriveUpdate{}) }},
		{"iface id with slash", func() error {
			return c.PutNetworkInterface(ctx, fcapi.NetworkInterface{IfaceID: "a/b", HostDevName: "t"})
		}},
		{"unknown action", func() error { return c.Action(ctx, "Reboot") }},
		{"unknown vm state", func() error { return c.PatchVM(ctx, "Stopped") }},
		{"unknown snapshot type", func() error {
			return c.CreateSnapshot(ctx, fcapi.SnapshotCreate{SnapshotType: "Incremental", SnapshotPath: "v", MemFilePath: "m"})
		}},
		{"load without memory", func() error { return c.LoadSnapshot(ctx, fcapi.SnapshotLoad{SnapshotPath: "v"}) }},
		{"load with both memories", func() error {
			return c.LoadSnapshot(ctx, fcapi.SnapshotLoad{SnapshotPath: "v", MemFilePath: "m", MemBackend: &fcapi.MemBackend{BackendType: "File", BackendPath: "m"}})
		}},
		{"load with unknown backend", func() error {
			return c.LoadSnapshot(ctx, fcapi.SnapshotLoad{SnapshotPath: "v", MemBackend: &fcapi.MemBackend{BackendType: "Anon", BackendPath: "m"}})
		}},
		{"override with bad id", func() error {
			return c.LoadSnapshot(ctx, fcapi.SnapshotLoad{SnapshotPath: "v", MemFilePath: "m", NetworkOverrides: []fcapi.NetworkOverride{{IfaceID: "eth-0", HostDevName: "t"}}})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, errkind.InvalidArgument) {
				t.Errorf("call = %v, want an invalid argument error", err)
			}
		})
	}
	if n := rec.count(); n != 0 {
		t.Errorf("%d requests sent, want none", n)
	}
}

func TestValidID(t *testing.T) {
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{"d0", true}, {"rootfs", true}, {"eth_0", true}, {"A9", true},
		{"", false}, {"d-0", false}, {"d.0", false}, {"d 0", false}, {"../x", false}, {"é", false},
	} {
		if got := fcapi.ValidID(tt.id) == nil; got != tt.want {
			t.Errorf("ValidID(%q) ok = %v, want %v", tt.id, got, tt.want)
		}
	}
}

func TestVersion(t *testing.T) {
	tests := []struct {
		in      string
		want    fcapi.Version
		wantErr bool
	}{
		{in: "1.16.1", want: fcapi.Version{Major: 1, Minor: 16, Patch: 1}},
		{in: "v1.4.0", want: fcapi.Version{Major: 1, Minor: 4}},
		{in: "1.17.0-dev", want: fcapi.Version{Major: 1, Minor: 17, Pre: "dev"}},
		{in: "1.16", wantErr: true},
		{in: "one.two.three", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := fcapi.ParseVersion(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseVersion(%q) error = %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseVersion(%q) (-want +got):\n%s", tt.in, diff)
		}
		if err == nil && got.String() != strings.TrimPrefix(tt.in, "v") {
			t.Errorf("ParseVersion(%q).String() = %q", tt.in, got.String())
		}
	}
	v := fcapi.Version{Major: 1, Minor: 13}
	for _, tt := range []struct {
		major, minor int
		want         bool
	}{{1, 12, true}, {1, 13, true}, {1, 14, false}, {0, 99, true}, {2, 0, false}} {
		if got := v.AtLeast(tt.major, tt.minor); got != tt.want {
			t.Errorf("1.13.0.AtLeast(%d, %d) = %v, want %v", tt.major, tt.minor, got, tt.want)
		}
	}
}

// TestClientAgainstFakeFirecracker drives a whole boot, pause, snapshot
// and a refused call through the client against the fake, which rejects
// anything malformed or out of order.
func TestClientAgainstFakeFirecracker(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"kernel", "initrd", "rootfs"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o600); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	sockDir, err := os.MkdirTemp("", "fcapi-v")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer os.RemoveAll(sockDir)
	f, sock := fcapitest.Serve(t, fcapitest.Config{ID: "vm-1"})
	c := fcapi.New(sock)
	defer c.Close()
	ctx := t.Context()
	steps := []struct {
		name string
		call func() error
	}{
		{"logger", func() error { return c.PutLogger(ctx, fcapi.Logger{Level: "Warning"}) }},
		{"metrics", func() error { return c.PutMetrics(ctx, fcapi.Metrics{MetricsPath: filepath.Join(dir, "metrics")}) }},
		{"machine", func() error { return c.PutMachineConfig(ctx, fcapi.MachineConfig{VCPUCount: 2, MemSizeMiB: 64}) }},
		{"boot source", func() error {
			return c.PutBootSource(ctx, fcapi.BootSource{KernelImagePath: filepath.Join(dir, "kernel"), InitrdPath: filepath.Join(dir, "initrd"), BootArgs: "console=ttyS0"})
		}},
		{"drive", func() error {
			return c.PutDrive(ctx, fcapi.Drive{DriveID: "rootfs", PathOnHost: filepath.Join(dir, "rootfs"), IsRootDevice: true, IsReadOnly: true})
		}},
		{"vsock", func() error {
			return c.PutVsock(ctx, fcapi.Vsock{GuestCID: 3, UDSPath: filepath.Join(sockDir, "v.sock")})
		}},
		{"nic", func() error {
			return c.PutNetworkInterface(ctx, fcapi.NetworkInterface{IfaceID: "eth0", HostDevName: "tap0", GuestMAC: "02:fc:00:00:00:01", MTU: 1400})
		}},
		{"entropy", func() error { return c.PutEntropy(ctx, fcapi.Entropy{}) }},
		{"balloon", func() error {
			return c.PutBalloon(ctx, fcapi.Balloon{AmountMiB: 0, DeflateOnOOM: true, StatsPollingIntervalS: 1})
		}},
		{"start", func() error { return c.Action(ctx, fcapi.InstanceStart) }},
		{"flush metrics", func() error { return c.Action(ctx, fcapi.FlushMetrics) }},
		{"inflate", func() error { return c.PatchBalloon(ctx, fcapi.BalloonUpdate{AmountMiB: 16}) }},
		{"stats", func() error { _, err := c.BalloonStatistics(ctx); return err }},
		{"pause", func() error { return c.PatchVM(ctx, fcapi.Paused) }},
		{"snapshot", func() error {
			return c.CreateSnapshot(ctx, fcapi.SnapshotCreate{SnapshotType: fcapi.Full, SnapshotPath: filepath.Join(dir, "vmstate"), MemFilePath: filepath.Join(dir, "memory")})
		}},
		{"resume", func() error { return c.PatchVM(ctx, fcapi.Resumed) }},
	}
	for _, s := range steps {
		if err := s.call(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	info, err := c.Instance(ctx)
	if err != nil || info.ID != "vm-1" || info.State != fcapi.StateRunning {
		t.Errorf("Instance() = %+v, %v; want vm-1 Running", info, err)
	}
	err = c.PutDrive(ctx, fcapi.Drive{DriveID: "d1", PathOnHost: filepath.Join(dir, "rootfs"), IsReadOnly: true})
	var fe *fcapi.Error
	if !errors.As(err, &fe) || fe.Status != 400 || !strings.Contains(fe.Fault, "after starting") {
		t.Errorf("PutDrive after start = %v, want the fake's 400 about a started microVM", err)
	}
	if got, want := len(f.Requests()), len(steps)+2; got != want {
		t.Errorf("fake saw %d requests, want %d", got, want)
	}
}

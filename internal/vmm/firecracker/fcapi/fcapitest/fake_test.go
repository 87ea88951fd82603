package fcapitest_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/testenv"
	"space/internal/vmm/firecracker/fcapi"
	"space/internal/vmm/firecracker/fcapi/fcapitest"
)

// step is one raw request to the fake and the status it must get. In
// path and body, $D stands for a scratch directory holding a file
// "kernel" and a 1 MiB file "disk".
type step struct {
	method, path, body string
	chunked            bool
	want               int
	wantFault          string // a substring of the fault message
}

type exits struct {
	mu sync.Mutex
	// +checklocks:mu
	codes []int
}

func (e *exits) record(code int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.codes = append(e.codes, code)
}

func (e *exits) get() []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]int(nil), e.codes...)
}

func rawClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func scratchDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fakefc-d")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "kernel"), []byte("ELF"), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "disk"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	return dir
}

// run sends the steps to a fake of the given version and checks each
// answer.
func run(t *testing.T, version string, dir string, steps []step) *exits {
	t.Helper()
	ex := &exits{}
	_, sock := fcapitest.Serve(t, fcapitest.Config{Version: version, Exit: ex.record, CtrlAltDelReboots: true})
	hc := rawClient(sock)
	for i, s := range steps {
		path := strings.ReplaceAll(s.path, "$D", dir)
		body := strings.ReplaceAll(s.body, "$D", dir)
		var r io.Reader
		if body != "" {
			r = strings.NewReader(body)
			if s.chunked {
				r = io.MultiReader(r) // hides the length: the client sends it chunked
			}
		}
		req, err := http.NewRequestWithContext(t.Context(), s.method, "http://localhost"+path, r)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("step %d: %s %s: %v", i, s.method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var fault struct {
			FaultMessage string `json:"fault_message"`
		}
		json.Unmarshal(b, &fault)
		if resp.StatusCode != s.want || !strings.Contains(fault.FaultMessage, s.wantFault) {
			t.Fatalf("step %d: %s %s %s = %d %s, want %d with fault containing %q", i, s.method, path, body, resp.StatusCode, b, s.want, s.wantFault)
		}
	}
	return ex
}

// boot is a minimal valid boot sequence.
var boot = []step{
	{method: "PUT", path: "/boot-source", body: `{"kernel_image_path":"$D/kernel"}`, want: 204},
	{method: "PUT", path: "/actions", body: `{"action_type":"InstanceStart"}`, want: 204},
}

func seq(parts ...[]step) []step {
	var all []step
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func TestFakeFirecrackerRules(t *testing.T) {
	tests := []struct {
		name      string
		version   string
		steps     []step
		wantExits []int
	}{
		{name: "unknown field", steps: []step{
			{method: "PUT", path: "/machine-config", body: `{"vcpu_count":1,"mem_size_mib":128,"memory_gib":1}`, want: 400, wantFault: "unknown field"},
		}},
		{name: "missing required field", steps: []step{
			{method: "PUT", path: "/machine-config", body: `{"mem_size_mib":128}`, want: 400, wantFault: "missing field `vcpu_count`"},
		}},
		{name: "chunked body reads as empty", steps: []step{
			{method: "PUT", path: "/entropy", body: `{}`, chunked: true, want: 400, wantFault: "Empty PUT request."},
			{method: "PUT", path: "/entropy", body: `{}`, want: 204},
		}},
		{name: "empty patch", steps: []step{{method: "PATCH", path: "/vm", want: 400, wantFault: "Empty PATCH request."}}},
		{name: "get with body", steps: []step{{method: "GET", path: "/", body: `{}`, want: 400, wantFault: "cannot have a body"}}},
		{name: "path id differs from body id", steps: []step{
			{method: "PUT", path: "/drives/d1", body: `{"drive_id":"d0","path_on_host":"$D/disk","is_root_device":false,"is_read_only":true}`, want: 400, wantFault: "does not match"},
		}},
		{name: "id with a dash", steps: []step{
			{method: "PUT", path: "/drives/d-0", body: `{"drive_id":"d-0","path_on_host":"$D/disk","is_root_device":false,"is_read_only":true}`, want: 400, wantFault: "Invalid ID"},
		}},
		{name: "missing drive file", steps: []step{
			{method: "PUT", path: "/drives/d0", body: `{"drive_id":"d0","path_on_host":"$D/nope","is_root_device":false,"is_read_only":true}`, want: 400},
		}},
		{name: "two root devices", steps: []step{
			{method: "PUT", path: "/drives/a", body: `{"drive_id":"a","path_on_host":"$D/disk","is_root_device":true,"is_read_only":true}`, want: 204},
			{method: "PUT", path: "/drives/b", body: `{"drive_id":"b","path_on_host":"$D/disk","is_root_device":true,"is_read_only":true}`, want: 400, wantFault: "root block device"},
		}},
		{name: "start needs a kernel", steps: []step{
			{method: "PUT", path: "/actions", body: `{"action_type":"InstanceStart"}`, want: 400, wantFault: "kernel"},
		}},
		{name: "post-boot calls before boot", steps: []step{
			{method: "PATCH", path: "/vm", body: `{"state":"Paused"}`, want: 400, wantFault: "before starting"},
			{method: "PUT", path: "/actions", body: `{"action_type":"FlushMetrics"}`, want: 400, wantFault: "before starting"},
			{method: "PUT", path: "/snapshot/create", body: `{"snapshot_path":"v","mem_file_path":"m"}`, want: 400, wantFault: "before starting"},
		}},
		{name: "pre-boot calls after boot", steps: seq(boot, []step{
			{method: "PUT", path: "/machine-config", body: `{"vcpu_count":1,"mem_size_mib":128}`, want: 400, wantFault: "after starting"},
			{method: "PUT", path: "/vsock", body: `{"guest_cid":3,"uds_path":"$D/v.sock"}`, want: 400, wantFault: "after starting"},
			{method: "PUT", path: "/logger", body: `{"level":"Info"}`, want: 400, wantFault: "after starting"},
			{method: "PUT", path: "/actions", body: `{"action_type":"InstanceStart"}`, want: 400, wantFault: "after starting"},
		})},
		{name: "load after boot-specific config", steps: []step{
			{method: "PUT", path: "/logger", body: `{"level":"Info"}`, want: 204},
			{method: "PUT", path: "/entropy", body: `{}`, want: 204},
			{method: "PUT", path: "/snapshot/load", body: `{"snapshot_path":"$D/v","mem_backend":{"backend_type":"File","backend_path":"$D/m"}}`, want: 400, wantFault: "not allowed after configuring boot-specific resources"},
		}},
		{name: "load with both memories", steps: []step{
			{method: "PUT", path: "/snapshot/load", body: `{"snapshot_path":"v","mem_file_path":"m","mem_backend":{"backend_type":"File","backend_path":"m"}}`, want: 400, wantFault: "not both"},
		}},
		{name: "failed load exits", steps: []step{
			{method: "PUT", path: "/snapshot/load", body: `{"snapshot_path":"$D/missing","mem_backend":{"backend_type":"File","backend_path":"$D/m"}}`, want: 400, wantFault: "Load snapshot error"},
		}, wantExits: []int{1}},
		{name: "metrics once", steps: []step{
			{method: "PUT", path: "/metrics", body: `{"metrics_path":"$D/metrics"}`, want: 204},
			{method: "PUT", path: "/metrics", body: `{"metrics_path":"$D/metrics"}`, want: 400},
		}},
		{name: "track_dirty_pages unknown before 1.13", version: "1.12.0", steps: []step{
			{method: "PUT", path: "/snapshot/load", body: `{"snapshot_path":"v","mem_backend":{"backend_type":"File","backend_path":"m"},"track_dirty_pages":true}`, want: 400, wantFault: "unknown field `track_dirty_pages`"},
		}},
		{name: "entropy unknown before 1.4", version: "1.3.0", steps: []step{
			{method: "PUT", path: "/entropy", body: `{}`, want: 400, wantFault: "Invalid request method and/or path"},
		}},
		{name: "snapshot needs a pause", steps: seq(boot, []step{
			{method: "PUT", path: "/snapshot/create", body: `{"snapshot_path":"$D/v","mem_file_path":"$D/m"}`, want: 400, wantFault: "pause it first"},
			{method: "PATCH", path: "/vm", body: `{"state":"Paused"}`, want: 204},
			{method: "PATCH", path: "/vm", body: `{"state":"Paused"}`, want: 204},
			{method: "PUT", path: "/snapshot/create", body: `{"snapshot_type":"Full","snapshot_path":"$D/v","mem_file_path":"$D/m"}`, want: 204},
		})},
		{name: "diff needs dirty tracking before 1.13", version: "1.12.0", steps: seq(boot, []step{
			{method: "PATCH", path: "/vm", body: `{"state":"Paused"}`, want: 204},
			{method: "PUT", path: "/snapshot/create", body: `{"snapshot_type":"Diff","snapshot_path":"$D/v","mem_file_path":"$D/m"}`, want: 400, wantFault: "dirty page tracking"},
		})},
		{name: "ctrl alt del reboots the guest", steps: seq(boot, []step{
			{method: "PUT", path: "/actions", body: `{"action_type":"SendCtrlAltDel"}`, want: 204},
		}), wantExits: []int{0}},
		{name: "unknown path", steps: []step{{method: "PUT", path: "/cpu-hotplug", body: `{}`, want: 400, wantFault: "Invalid request method and/or path"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex := run(t, tt.version, scratchDir(t), tt.steps)
			// The fake exits after the response has gone out.
			testenv.Eventually(t, 5*time.Second, func() bool { return len(ex.get()) >= len(tt.wantExits) })
			if diff := cmp.Diff(tt.wantExits, ex.get()); diff != "" {
				t.Errorf("exits (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFakeFirecrackerSnapshotRoundTrip: what one fake writes, a fresh one
// loads, and the loaded VM has the saved devices.
func TestFakeFirecrackerSnapshotRoundTrip(t *testing.T) {
	dir := scratchDir(t)
	run(t, "", dir, []step{
		{method: "PUT", path: "/machine-config", body: `{"vcpu_count":2,"mem_size_mib":16}`, want: 204},
		{method: "PUT", path: "/boot-source", body: `{"kernel_image_path":"$D/kernel"}`, want: 204},
		{method: "PUT", path: "/drives/d0", body: `{"drive_id":"d0","path_on_host":"$D/disk","is_root_device":false,"is_read_only":false}`, want: 204},
		{method: "PUT", path: "/vsock", body: `{"guest_cid":3,"uds_path":"$D/v.sock"}`, want: 204},
		{method: "PUT", path: "/network-interfaces/eth0", body: `{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"02:fc:00:00:00:01"}`, want: 204},
		{method: "PUT", path: "/actions", body: `{"action_type":"InstanceStart"}`, want: 204},
		{method: "PATCH", path: "/vm", body: `{"state":"Paused"}`, want: 204},
		{method: "PUT", path: "/snapshot/create", body: `{"snapshot_path":"$D/vmstate","mem_file_path":"$D/memory"}`, want: 204},
	})
	if fi, err := os.Stat(filepath.Join(dir, "memory")); err != nil || fi.Size() != 16<<20 {
		t.Fatalf("memory file = %v, %v; want 16 MiB", fi, err)
	}
	// The first fake still holds its vsock socket (until t ends): bind
	// the clone's elsewhere, as a clone in the same directory would.
	f, sock := fcapitest.Serve(t, fcapitest.Config{})
	c := fcapi.New(sock)
	ctx := t.Context()
	err := c.LoadSnapshot(ctx, fcapi.SnapshotLoad{
		SnapshotPath:     filepath.Join(dir, "vmstate"),
		MemBackend:       &fcapi.MemBackend{BackendType: fcapi.BackendFile, BackendPath: filepath.Join(dir, "memory")},
		ResumeVM:         true,
		NetworkOverrides: []fcapi.NetworkOverride{{IfaceID: "eth0", HostDevName: "tap1"}},
		VsockOverride:    &fcapi.VsockOverride{UDSPath: filepath.Join(dir, "clone.sock")},
	})
	if err != nil {
		t.Fatalf("LoadSnapshot: %v", err)
	}
	info, err := c.Instance(ctx)
	if err != nil || info.State != fcapi.StateRunning {
		t.Errorf("Instance() = %+v, %v; want state Running", info, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "clone.sock")); err != nil {
		t.Errorf("vsock socket after load: %v", err)
	}
	// A loaded VM is post-boot: configuration is refused.
	if err := c.PutEntropy(ctx, fcapi.Entropy{}); !fcapi.IsRejected(err) {
		t.Errorf("PutEntropy after load = %v, want a rejection", err)
	}
	if got := len(f.Requests()); got != 3 {
		t.Errorf("fake saw %d requests, want 3", got)
	}
}

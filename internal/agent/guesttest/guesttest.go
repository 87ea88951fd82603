// Package guesttest boots real SPACE guests for tests: it builds the agent
// and the guest images once per content hash into the shared test cache,
// caps how many test VMs run at once across test processes, and hands back a
// booted VM with a connected agent client.
package guesttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"space/internal/cachedir"
	"space/internal/guestvm"
	"space/internal/imagebuild"
	"space/internal/testenv"
	"space/internal/vmm/qemu"
)

var (
	buildOnce sync.Once
	built     *imagebuild.Artifacts
	buildErr  error
)

// Images returns the guest images, building the agent from this checkout
// and anything the cache lacks. The first call in a process may take
// minutes on a cold cache; later calls are free.
func Images(t testing.TB) *imagebuild.Artifacts {
	t.Helper()
	testenv.RequireQEMU(t)
	testenv.RequireRoot(t, testenv.TierQEMU) // debootstrap of the default root needs root
	buildOnce.Do(func() { built, buildErr = buildImages() })
	if buildErr != nil {
		t.Fatalf("setup: guest images: %v", buildErr)
	}
	return built
}

func buildImages() (*imagebuild.Artifacts, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	agent, err := BuildAgent(ctx)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(filepath.Dir(agent)) // the images hold their copy
	cache, err := cachedir.Open(cacheBase())
	if err != nil {
		return nil, err
	}
	return imagebuild.Build(ctx, imagebuild.Config{Cache: cache, AgentPath: agent})
}

func cacheBase() string { return cachedir.DefaultBase(nil) }

// Agent builds space-agent from this checkout (BuildAgent) for t and
// removes it when t ends.
func Agent(t testing.TB) string {
	t.Helper()
	bin, err := BuildAgent(t.Context())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(bin)) })
	return bin
}

// BuildAgent builds space-agent from this checkout, reproducibly (the same
// source gives the same bytes, so the initramfs cache key is stable), and
// returns its path, in a directory of its own that the caller removes.
func BuildAgent(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	dir, err := os.MkdirTemp("", "space-agent-build-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "space-agent")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, "./cmd/space-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build space-agent: %v\n%s", err, out)
	}
	return bin, nil
}

// Options shape a test VM. Zero values give 1 vCPU and 512 MiB.
type Options struct {
	VCPUs     int
	MemoryMiB int
}

// VM is a booted guest with a connected agent.
type VM struct {
	*guestvm.VM
	closeOnce sync.Once
	closeFn   func()
}

// Close stops the VM, removes its files and frees its test slot. It is
// idempotent; Boot registers it as a cleanup of the test.
func (v *VM) Close() { v.closeOnce.Do(v.closeFn) }

// Boot boots a guest from the default images and waits for its agent. The
// VM is stopped and its files removed when t ends; its console log is
// printed if t failed.
func Boot(t testing.TB, opts Options) *VM {
	t.Helper()
	img := Images(t)
	release := acquireSlot(t)
	drv, err := Driver(t)
	if err != nil {
		release()
		t.Fatalf("setup: %v", err)
	}
	// Guest RAM is a shared file mapping: keep it on tmpfs, and keep the
	// path short enough for unix sockets.
	run, err := os.MkdirTemp("/dev/shm", "space-test-vm-")
	if err != nil {
		release()
		t.Fatalf("setup: vm dir: %v", err)
	}
	data, err := os.MkdirTemp("", "space-test-data-")
	if err != nil {
		os.RemoveAll(run)
		release()
		t.Fatalf("setup: data dir: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gv, err := guestvm.Boot(ctx, guestvm.Config{
		Images: img, Driver: drv, RunDir: run, DataDir: data,
		VCPUs: opts.VCPUs, MemoryMiB: opts.MemoryMiB,
	})
	if err != nil {
		release()
		t.Fatalf("setup: boot guest: %v", err)
	}
	v := &VM{VM: gv}
	v.closeFn = func() {
		defer release()
		if t.Failed() {
			if sl, ok := gv.VMM.(interface{ SerialLog() ([]byte, error) }); ok {
				log, _ := sl.SerialLog()
				t.Logf("guest console:\n%s", log)
			}
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := gv.Close(cctx); err != nil {
			t.Errorf("close guest: %v", err)
		}
	}
	t.Cleanup(v.Close)
	return v
}

// Driver returns a QEMU driver that remembers its KVM probe in the test
// cache, so test processes probe once per host boot.
func Driver(t testing.TB) (*qemu.Driver, error) {
	t.Helper()
	return qemu.New(qemu.Config{AccelCache: filepath.Join(cacheBase(), cachedir.Layout, "accel-probe.json")})
}

// AcquireSlot takes one of the machine-wide test VM slots and returns its
// release; tests that boot VMs without Boot call it first.
func AcquireSlot(t testing.TB) (release func()) {
	t.Helper()
	return acquireSlot(t)
}

// acquireSlot takes one of the machine-wide test VM slots (SPACE_TEST_VMS,
// default 2) and returns its release, so parallel test packages don't
// oversubscribe two cores with emulated CPUs.
func acquireSlot(t testing.TB) (release func()) {
	t.Helper()
	n := slotCount()
	cache, err := cachedir.Open(cacheBase())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	deadline := time.Now().Add(15 * time.Minute)
	for {
		for i := range n {
			unlock, ok, err := cache.TryLock("test-vm-slot-" + strconv.Itoa(i))
			if err != nil {
				t.Fatalf("setup: vm slot: %v", err)
			}
			if ok {
				return unlock
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("setup: no free test VM slot within 15m")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// AcquireAllSlots takes every machine-wide test VM slot, for a test that
// runs several VMs at once, and returns the release of all of them. It
// never holds some slots while waiting for others (a test holding one slot
// may be waiting for a second), so it takes them all at once or none.
func AcquireAllSlots(t testing.TB) (release func()) {
	t.Helper()
	cache, err := cachedir.Open(cacheBase())
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	deadline := time.Now().Add(15 * time.Minute)
	for {
		var unlocks []func()
		releaseAll := func() {
			for i := len(unlocks) - 1; i >= 0; i-- {
				unlocks[i]()
			}
		}
		for i := range slotCount() {
			unlock, ok, err := cache.TryLock("test-vm-slot-" + strconv.Itoa(i))
			if err != nil {
				releaseAll()
				t.Fatalf("setup: vm slot: %v", err)
			}
			if !ok {
				break
			}
			unlocks = append(unlocks, unlock)
		}
		if len(unlocks) == slotCount() {
			return releaseAll
		}
		releaseAll()
		if time.Now().After(deadline) {
			t.Fatalf("setup: test VM slots not all free within 15m")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// CacheBase returns the artifact cache base the tests share.
func CacheBase() string { return cacheBase() }

// slotCount is the number of machine-wide test VM slots (SPACE_TEST_VMS,
// default 2).
func slotCount() int {
	if s := os.Getenv("SPACE_TEST_VMS"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			return v
		}
	}
	return 2
}

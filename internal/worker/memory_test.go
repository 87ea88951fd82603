package worker

import (
	"errors"
	"os"
	"strings"
	"testing"

	"space/internal/vmm"
)

// pidVM is a VM whose VMM process is the one named; only Info works.
type pidVM struct {
	vmm.VM
	pid int
}

func (v pidVM) Info() (vmm.ProcessInfo, error) { return vmm.ProcessInfo{PID: v.pid}, nil }

// TestMemoryCharge checks what a sandbox counts against the worker's
// memory: its size until measured, then its measured PSS plus headroom,
// never more than its size.
func TestMemoryCharge(t *testing.T) {
	s := &sbx{}
	s.mu.Lock()
	s.rec.Spec.MemoryMiB = 1 << 20
	s.vm = pidVM{pid: os.Getpid()} // this test process stands in for a VMM
	unmeasured := s.chargeMiBLocked(64)
	s.mu.Unlock()
	if unmeasured != 1<<20 {
		t.Errorf("charge before a measurement = %d MiB, want the size, %d", unmeasured, 1<<20)
	}
	s.measureMemory()
	s.mu.Lock()
	pss, measured := s.pss, s.chargeMiBLocked(64)
	s.rec.Spec.MemoryMiB = 64
	small := s.chargeMiBLocked(64)
	s.mu.Unlock()
	if pss <= 0 || measured != pss>>20+64 {
		t.Errorf("charge after a measurement of %d bytes = %d MiB, want PSS + 64 = %d", pss, measured, pss>>20+64)
	}
	if small != 64 {
		t.Errorf("charge of a sandbox smaller than its measurement = %d MiB, want its size, 64", small)
	}
}

// TestAdmissionKeepsHostReserve checks that a host short of available
// memory admits no sandbox, whatever the charges leave free.
func TestAdmissionKeepsHostReserve(t *testing.T) {
	w := newTestWorker(t)
	w.cfg.MemoryReserveMiB = 1 << 40
	err := w.reserve("sbx_aaaaaaaaaaaaaaaaaaaa", &sbx{}, Spec{Template: "default", VCPUs: 1, MemoryMiB: 128, DiskMiB: 1024})
	if !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "reserve") {
		t.Errorf("reserve with the host under its reserve = %v, want no capacity naming the reserve", err)
	}
	if st, _ := w.Status(t.Context()); st.Sandboxes != 0 {
		t.Errorf("after a refused admission the worker has %d sandboxes, want 0", st.Sandboxes)
	}
}

// TestVMMLimits: a VMM's group lets it use its vCPUs and the CPU time its
// own threads need beside them, and its guest memory plus the VMM's heap.
func TestVMMLimits(t *testing.T) {
	for _, vcpus := range []int{1, 2, 8} {
		l := limits(Spec{VCPUs: vcpus, MemoryMiB: 512})
		if want := float64(vcpus) + vmmOverheadCPUs; l.CPUs != want {
			t.Errorf("%d vCPUs: CPU limit %v, want %v", vcpus, l.CPUs, want)
		}
		if want := int64(512+vmmOverheadMiB) << 20; l.MemoryBytes != want {
			t.Errorf("%d vCPUs: memory limit %d, want %d", vcpus, l.MemoryBytes, want)
		}
	}
}

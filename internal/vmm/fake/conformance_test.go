package fake_test

import (
	"testing"

	"space/internal/vmm"
	"space/internal/vmm/vmmtest"
)

// TestConformance runs the vmm suite against the fake. Its guests are
// jailed processes, so the suite's NoGuestKernel (no vCPU or memory
// limits, accelerator, hostname or tap NIC) and NoProcessSnapshot
// (snapshots keep files, not processes) apply.
func TestConformance(t *testing.T) {
	vmmtest.RunWith(t, func(t *testing.T) vmm.Driver { return newDriver(t) },
		vmmtest.Options{NoGuestKernel: true, NoProcessSnapshot: true})
}

package qemu_test

import (
	"testing"

	"space/internal/agent/guesttest"
	"space/internal/vmm"
	"space/internal/vmm/vmmtest"
)

func TestConformance(t *testing.T) {
	vmmtest.Run(t, func(t *testing.T) vmm.Driver {
		d, err := guesttest.Driver(t)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		return d
	})
}

func BenchmarkQEMU(b *testing.B) {
	vmmtest.Bench(b, func(b *testing.B) vmm.Driver {
		d, err := guesttest.Driver(b)
		if err != nil {
			b.Fatalf("setup: %v", err)
		}
		return d
	})
}

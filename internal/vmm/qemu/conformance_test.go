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

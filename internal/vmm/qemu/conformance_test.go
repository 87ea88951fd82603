package qemu_test

import (
	"path/filepath"
	"testing"

	"space/internal/agent/guesttest"
	"space/internal/cachedir"
	"space/internal/testenv"
	"space/internal/vmm"
	"space/internal/vmm/qemu"
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

// TestConformanceJailedAsUser runs the suite with QEMU jailed (a host
// that cannot is an error) as a configured user, nobody. (TestConformance
// runs it as the driver's default user, jailed too when root.)
func TestConformanceJailedAsUser(t *testing.T) {
	testenv.RequireRoot(t, testenv.TierQEMU)
	vmmtest.Run(t, func(t *testing.T) vmm.Driver {
		d, err := qemu.New(qemu.Config{
			User:       &qemu.User{UID: 65534, GID: 65534},
			Jail:       qemu.JailRequire,
			AccelCache: filepath.Join(testenv.CacheDir(t), cachedir.Layout, "accel-probe.json"),
		})
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

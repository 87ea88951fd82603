// Package testenv gates tests on the environment tiers they need and gives
// them shared helpers (cache directory, polling).
//
// A test never calls t.Skip for an environment reason itself: it calls a gate
// (RequireQEMU, RequireRoot, ...). A gate skips with a message that names the
// tier and the reason, unless the tier is required here (SPACE_TEST_TIERS, or
// every tier when CI=true and SPACE_TEST_TIERS is unset), in which case the
// test fails.
package testenv

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"space/internal/cachedir"
)

// Tier names one kind of environment a test may need.
type Tier string

// The tiers. Their string values are what SPACE_TEST_TIERS lists.
const (
	TierUnit        Tier = "unit"
	TierQEMU        Tier = "qemu"
	TierKVM         Tier = "kvm"
	TierFirecracker Tier = "firecracker"
	TierPostgres    Tier = "postgres"
	TierNetns       Tier = "netns"
	TierS3          Tier = "s3"
	TierK8s         Tier = "k8s"
	TierSlow        Tier = "slow"
)

// Required reports whether tier must run here (SPACE_TEST_TIERS lists it,
// or CI=true and SPACE_TEST_TIERS is unset), so that a gate may spend time
// making it available (building a tool) rather than skipping.
func Required(tier Tier) bool { return required(tier) }

func required(tier Tier) bool {
	list, set := os.LookupEnv("SPACE_TEST_TIERS")
	if !set {
		return os.Getenv("CI") == "true"
	}
	return slices.Contains(strings.Split(list, ","), string(tier))
}

// Unavailable skips (or, where tier is required, fails) t because tier is
// missing for the reason why.
func Unavailable(t testing.TB, tier Tier, why string) {
	t.Helper()
	if required(tier) {
		t.Fatalf("test tier %q is required here but unavailable: %s", tier, why)
	}
	t.Skipf("test tier %q unavailable: %s (set SPACE_TEST_TIERS=%s to require it)", tier, why, tier)
}

// RequireRoot gates tests that need root (they count toward the netns tier).
func RequireRoot(t testing.TB, tier Tier) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, tier, "needs root")
	}
}

// RequireTool gates a test on a host command being on PATH.
func RequireTool(t testing.TB, tier Tier, tool, aptPackage string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		Unavailable(t, tier, tool+": not found (apt package "+aptPackage+")")
	}
}

// RequireQEMU gates tests that boot real VMs under QEMU (KVM or TCG).
func RequireQEMU(t testing.TB) {
	t.Helper()
	RequireTool(t, TierQEMU, "qemu-system-x86_64", "qemu-system-x86")
}

// RequireSlow gates tests that take minutes (network downloads, bootstraps).
// They run in CI and when SPACE_TEST_TIERS lists "slow".
func RequireSlow(t testing.TB) {
	t.Helper()
	if testing.Short() {
		Unavailable(t, TierSlow, "-short given")
	}
	if !required(TierSlow) && os.Getenv("CI") != "true" {
		Unavailable(t, TierSlow, "slow tests run in CI or with SPACE_TEST_TIERS=slow")
	}
}

// CacheDir returns the shared artifact cache for tests: SPACE_CACHE_DIR if set,
// else the user's cache directory plus "space".
func CacheDir(t testing.TB) string {
	t.Helper()
	d := cachedir.DefaultBase(nil)
	if d == "" {
		t.Fatalf("setup: no cache directory: set SPACE_CACHE_DIR")
	}
	return d
}

// Eventually polls cond every 20ms until it returns true or timeout passes,
// then fails t.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

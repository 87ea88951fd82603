package controlplane

import (
	"strings"
	"testing"

	"space/api"
)

// TestDiskPlacement checks that creates go only to a worker with room for
// their disk, that a disk larger than any worker can ever give is refused
// at the API as invalid, saying so, and that one no worker has room for
// now is unavailable.
func TestDiskPlacement(t *testing.T) {
	small := newVMMWorker("small", "qemu", "7.2.19", 1<<20)
	small.diskMiB = 2048
	big := newVMMWorker("big", "qemu", "7.2.19", 1<<20)
	big.diskMiB = 8192
	_, _, do := compatServer(t, small, big)

	// 4 GiB fits only the big worker, and only once.
	code, body := do("POST", "/v1/sandboxes", `{"disk_mib":4096}`)
	sb := decode[api.Sandbox](t, "create of 4096 MiB", code, body, 201)
	if sb.DiskMiB != 4096 {
		t.Errorf("create of 4096 MiB: disk_mib %d, want 4096", sb.DiskMiB)
	}
	if creates, _ := small.asked(); len(creates) != 0 {
		t.Errorf("the worker with 2048 MiB of disk was asked to create %q, want nothing", creates)
	}
	code, body = do("POST", "/v1/sandboxes", `{"disk_mib":2048}`) // either has room
	decode[api.Sandbox](t, "create of 2048 MiB", code, body, 201)

	// More than the largest worker's storage: never possible.
	code, body = do("POST", "/v1/sandboxes", `{"disk_mib":16384}`)
	e := decode[api.Error](t, "create of 16384 MiB", code, body, 400)
	if want := "disk_mib 16384 is more than any worker can give: the largest gives 8192 MiB"; !strings.Contains(e.Error.Message, want) {
		t.Errorf("create of 16384 MiB = %s, want it saying %q", body, want)
	}

	// Possible, but no worker has that much free now.
	code, body = do("POST", "/v1/sandboxes", `{"disk_mib":6144}`)
	e = decode[api.Error](t, "create of 6144 MiB", code, body, 503)
	if want := "6144 MiB of disk free"; e.Error.Code != api.CodeUnavailable || !strings.Contains(e.Error.Message, want) {
		t.Errorf("create of 6144 MiB with 4096 MiB promised = %s, want unavailable saying %q", body, want)
	}
}

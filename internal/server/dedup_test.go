package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/testenv"
)

// TestSnapshotDedupPerTeam is issue 36's convergent-storage probe through
// the API, on the fake VMM (whose snapshot is an archive of the guest's
// writable directories): team A writes 8 MiB of random bytes and
// snapshots; team B writes the same bytes and snapshots; team C writes
// other random bytes and snapshots. B's new_bytes must be C's, give or
// take the few chunks of what differs between any two sandboxes, not 8
// MiB less. A second sandbox of team A storing the same bytes shows that
// the harness does see deduplication where it is allowed.
func TestSnapshotDedupPerTeam(t *testing.T) {
	ts := startFakeServer(t, 0, 0)
	checkDedupPerTeam(t, ts, api.CreateSandbox{}, "/work/blob")
}

// dedupProbe is what checkDedupPerTeam measured: the new_bytes of each
// snapshot.
type dedupProbe struct {
	a1, a2, bSame, cOther int64
}

// checkDedupPerTeam runs the probe on ts with sandboxes made as req asks,
// writing the bytes at path in the guest, and returns what it measured.
func checkDedupPerTeam(t *testing.T, ts *testServer, req api.CreateSandbox, path string) dedupProbe {
	t.Helper()
	ctx := t.Context()
	const size = 8 << 20
	teams := map[string]*client.Client{}
	for _, team := range []string{"dedup-a", "dedup-b", "dedup-c"} {
		k, err := ts.client.CreateAPIKey(ctx, api.CreateAPIKey{Name: team, Team: team})
		if err != nil {
			t.Fatalf("setup: CreateAPIKey(%s) = %v", team, err)
		}
		c, err := client.New(ts.url, k.Secret)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		teams[team] = c
	}
	secret, other := make([]byte, size), make([]byte, size)
	rand.Read(secret)
	rand.Read(other)
	snapshot := func(team string, data []byte) int64 {
		t.Helper()
		c := teams[team]
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatalf("%s: CreateSandbox = %v", team, err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.DeleteSandbox(ctx, sb.ID); err != nil && !client.IsNotFound(err) {
				t.Errorf("cleanup: delete %s: %v", sb.ID, err)
			}
		})
		if _, err := c.WriteFile(ctx, sb.ID, path, bytes.NewReader(data), client.WriteOptions{Mode: 0o600, Mkdir: true}); err != nil {
			t.Fatalf("%s: WriteFile(%s) = %v", team, path, err)
		}
		if _, _, code := execOut(t, c, sb.ID, sh("sync")); code != 0 {
			t.Fatalf("%s: sync exited %d", team, code)
		}
		sn, err := c.CreateSnapshot(ctx, sb.ID, "")
		if err != nil {
			t.Fatalf("%s: CreateSnapshot = %v", team, err)
		}
		testenv.Eventually(t, 2*time.Minute, func() bool {
			sn, err = c.Snapshot(ctx, sn.ID)
			return err == nil && sn.State == "ready"
		})
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.DeleteSnapshot(ctx, sn.ID); err != nil && !client.IsNotFound(err) {
				t.Errorf("cleanup: delete snapshot %s: %v", sn.ID, err)
			}
		})
		return sn.NewBytes
	}
	var p dedupProbe
	p.a1 = snapshot("dedup-a", secret)
	p.a2 = snapshot("dedup-a", secret)
	p.bSame = snapshot("dedup-b", secret)
	p.cOther = snapshot("dedup-c", other)
	const mib = 1 << 20
	t.Logf("new_bytes: team A first %.2f MiB, team A again %.2f MiB, team B with A's bytes %.2f MiB, team C with other bytes %.2f MiB",
		float64(p.a1)/mib, float64(p.a2)/mib, float64(p.bSame)/mib, float64(p.cOther)/mib)
	if p.a2 > p.a1-size/2 {
		t.Errorf("team A's second snapshot of the same bytes stored %d bytes, its first %d: want the bytes stored once (the probe cannot see deduplication)", p.a2, p.a1)
	}
	if d := p.cOther - p.bSame; d > size/8 || d < -size/8 {
		t.Errorf("team B's snapshot of team A's bytes stored %d bytes, team C's of other bytes %d: %d apart, want the same within %d (another team's data shows)",
			p.bSame, p.cOther, d, size/8)
	}
	return p
}

// TestSnapshotDedupPerTeamVM is the probe on real VMs, whose snapshots
// hold the guest's memory and disk, as issue 36 ran it. Its log shows
// what per-team domains cost: a team's first snapshot no longer shares
// the template's pages with other teams' snapshots.
func TestSnapshotDedupPerTeamVM(t *testing.T) {
	testenv.RequireSlow(t) // four VMs, 1-4 minutes under TCG
	ts := startServerWith(t, Config{})
	ts.deleteAllOnCleanup(t)
	checkDedupPerTeam(t, ts, api.CreateSandbox{MemoryMiB: 512}, "/root/blob")
}

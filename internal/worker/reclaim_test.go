package worker

import (
	"testing"
	"time"

	"space/internal/agent/guesttest"
	"space/internal/testenv"
)

// TestIdleReclaim: a sandbox that filled its guest's page cache gives that
// memory back to the host once idle, measurably in its VMM's PSS; a
// sandbox in use is left alone, and an idle spell is reclaimed once.
func TestIdleReclaim(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	// Rounds are run by hand below; the loop's own would wait an hour.
	w := newVMWorkerWith(t, func(cfg *Config) { cfg.ReclaimIdleAfter = time.Hour })
	ctx := t.Context()
	id := sandboxID(0)
	if _, err := w.Create(ctx, CreateRequest{ID: id, Team: "team", Spec: Spec{Template: "default", VCPUs: 1, MemoryMiB: 512, DiskMiB: 1024}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	const fileMiB = 200
	shell(t, w, id, "dd if=/dev/urandom of=/root/f bs=1M count=200 2>/dev/null && sync && cat /root/f > /dev/null")
	s, err := w.get(id)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	pss := func() int64 {
		s.measureMemory()
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.pss >> 20
	}
	reclaimed := func() time.Time {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.reclaimed
	}
	idleSince := func(d time.Duration) {
		s.mu.Lock()
		s.lastActive = time.Now().Add(-d)
		s.mu.Unlock()
	}
	before := pss()

	// In use (a request under way), however long ago it began: no reclaim.
	done := s.use(time.Now)
	idleSince(2 * time.Hour)
	w.reclaimIdle()
	done()
	// Used recently: no reclaim either.
	w.reclaimIdle()
	if !reclaimed().IsZero() {
		t.Fatalf("a sandbox in use or just used was reclaimed")
	}

	idleSince(2 * time.Hour)
	w.reclaimIdle()
	at := reclaimed()
	if at.IsZero() {
		t.Fatalf("an idle sandbox was not reclaimed")
	}
	var after int64
	testenv.Eventually(t, 30*time.Second, func() bool {
		after = pss()
		return after <= before-fileMiB/2
	})
	t.Logf("VMM PSS %d MiB with %d MiB of the guest's page cache, %d MiB after the reclaim", before, fileMiB, after)

	// The same idle spell is not reclaimed again.
	w.reclaimIdle()
	if got := reclaimed(); !got.Equal(at) {
		t.Errorf("the same idle spell was reclaimed twice")
	}
	// The file is still there, read again from disk.
	if got := shell(t, w, id, "wc -c < /root/f"); got != "209715200\n" {
		t.Errorf("file after the reclaim: %q bytes", got)
	}
}

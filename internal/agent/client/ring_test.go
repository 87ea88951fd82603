package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/agent/server"
	"space/internal/testenv"
)

// sharedRegions maps one memory file twice, as a VMM's host and its guest
// see the ring device, and returns the two sides.
func sharedRegions(t *testing.T, size int) (host, guest *ring.Region) {
	t.Helper()
	fd, err := unix.MemfdCreate("ring", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("setup: memfd: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatalf("setup: truncate: %v", err)
	}
	var mems [2][]byte
	for i := range mems {
		m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("setup: mmap: %v", err)
		}
		// Unmapped once the test's clients and servers are gone, which
		// its other cleanups wait for (registered later, run earlier).
		t.Cleanup(func() { unix.Munmap(m) })
		mems[i] = m
	}
	if host, err = ring.New(mems[0], ring.Host); err != nil {
		t.Fatalf("setup: host region: %v", err)
	}
	if guest, err = ring.New(mems[1], ring.Guest); err != nil {
		t.Fatalf("setup: guest region: %v", err)
	}
	return host, guest
}

// opener stands in for mapping the guest's RAM: it hands out r, after
// checking the agent offered the chunks of its region.
func opener(t *testing.T, r *ring.Region) client.RingOpener {
	return func(chunks []uint64) (*ring.Region, func(), error) {
		if len(chunks)*ring.ChunkSize != r.Size() {
			return nil, nil, fmt.Errorf("offer of %d chunks for a region of %d bytes", len(chunks), r.Size())
		}
		return r, func() {}, nil
	}
}

// TestAgentInProcessRing runs the agent conformance suite with bulk bytes
// moving through a ring, then checks the ring's own promises.
func TestAgentInProcessRing(t *testing.T) {
	host, guest := sharedRegions(t, 2*ring.ChunkSize)
	a, c := inProcessWith(t, server.Config{Version: "test", Ring: guest, RingChunks: []uint64{0, 2 << 20}}, client.WithRing(opener(t, host)))
	if !c.Ring() {
		t.Fatalf("client has no ring after dialling with one")
	}
	agenttest.Run(t, c, agenttest.Options{
		Scratch: t.TempDir(),
		Reconnect: func(ctx context.Context, old *client.Client) (*client.Client, error) {
			old.Close()
			return a.connect(ctx)
		},
	})
	c, err := a.connect(t.Context())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	dir := t.TempDir()
	ctx := t.Context()

	t.Run("FileRoundTrip", func(t *testing.T) {
		// Sizes around the slot and the inline threshold.
		for _, n := range []int{0, 1, 16<<10 - 1, 16 << 10, ring.SlotSize - 1, ring.SlotSize, ring.SlotSize + 1, 5*ring.SlotSize + 77} {
			data := make([]byte, n)
			rand.Read(data)
			path := fmt.Sprintf("%s/f%d", dir, n)
			if _, err := c.WriteFile(ctx, proto.WriteArgs{Path: path}, bytes.NewReader(data)); err != nil {
				t.Fatalf("WriteFile(%d bytes) = %v", n, err)
			}
			var got bytes.Buffer
			if _, err := c.ReadFile(ctx, path, &got); err != nil {
				t.Fatalf("ReadFile(%d bytes) = %v", n, err)
			}
			if !bytes.Equal(got.Bytes(), data) {
				t.Errorf("ReadFile after WriteFile of %d bytes: %d bytes back, not the same", n, got.Len())
			}
		}
	})

	t.Run("CutSourceFails", func(t *testing.T) {
		// A source that breaks off (an HTTP body cut short reads as
		// io.ErrUnexpectedEOF) fails the write and leaves the old file.
		path := dir + "/keep"
		if _, err := c.WriteFile(ctx, proto.WriteArgs{Path: path}, strings.NewReader("old")); err != nil {
			t.Fatalf("setup: %v", err)
		}
		src := io.MultiReader(bytes.NewReader(make([]byte, 3*ring.SlotSize+5)), iotest.ErrReader(io.ErrUnexpectedEOF))
		if _, err := c.WriteFile(ctx, proto.WriteArgs{Path: path}, src); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("WriteFile from a cut source = %v, want its error", err)
		}
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, path, &got); err != nil || got.String() != "old" {
			t.Errorf("after the cut write the file holds %d bytes (%v), want the old 3", got.Len(), err)
		}
	})

	t.Run("ExecOutputExact", func(t *testing.T) {
		// 24 MiB of pseudo-random bytes on stdout and a little on stderr.
		const n = 24 << 20
		var out, errOut bytes.Buffer
		exit, err := c.Exec(ctx, proto.ExecRequest{Shell: fmt.Sprintf("head -c %d /dev/urandom | tee %s/out; echo done >&2", n, dir)}, client.IO{Stdout: &out, Stderr: &errOut})
		if err != nil || exit.Code != 0 {
			t.Fatalf("Exec = %+v, %v", exit, err)
		}
		var want bytes.Buffer
		if _, err := c.ReadFile(ctx, dir+"/out", &want); err != nil {
			t.Fatalf("ReadFile: %v", err)
		}
		if out.Len() != n || sha256.Sum256(out.Bytes()) != sha256.Sum256(want.Bytes()) {
			t.Errorf("stdout: %d bytes, want the %d bytes of the file", out.Len(), n)
		}
		if errOut.String() != "done\n" {
			t.Errorf("stderr = %q, want done", errOut.String())
		}
	})

	t.Run("StdinThroughRing", func(t *testing.T) {
		testenv.Eventually(t, 10*time.Second, c.RingStdin)
		// Random input in reads of every size around the thresholds comes
		// back byte-exact.
		in := make([]byte, 12<<20)
		rand.Read(in)
		var out bytes.Buffer
		src := &sizedReader{r: bytes.NewReader(in), sizes: []int{1, ring.MinPayload - 1, ring.MinPayload, ring.SlotSize, ring.SlotSize - 1, 100 << 10}}
		exit, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"cat"}}, client.IO{Stdin: src, Stdout: &out})
		if err != nil || exit.Code != 0 {
			t.Fatalf("cat = %+v, %v", exit, err)
		}
		if !bytes.Equal(out.Bytes(), in) {
			t.Errorf("stdin through the ring: %d bytes back, want the %d sent, byte-exact", out.Len(), len(in))
		}
		if host.FreeSlots() != host.Slots() {
			t.Errorf("after the exec %d of %d host slots are free", host.FreeSlots(), host.Slots())
		}
	})

	t.Run("StdinNotReadHoldsFewSlots", func(t *testing.T) {
		// A process that never reads its input holds at most two slots:
		// a file goes through the ring meanwhile, and once the process is
		// killed every slot is back.
		testenv.Eventually(t, 10*time.Second, c.RingStdin)
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		p, err := c.Start(pctx, proto.ExecRequest{Argv: []string{"sleep", "60"}}, client.IO{Stdin: bytes.NewReader(make([]byte, 64<<20))})
		if err != nil {
			t.Fatalf("Start: %v", err)
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return host.FreeSlots() == host.Slots()-2 })
		data := make([]byte, 6*ring.SlotSize)
		rand.Read(data)
		if _, err := c.WriteFile(ctx, proto.WriteArgs{Path: dir + "/beside"}, bytes.NewReader(data)); err != nil {
			t.Fatalf("WriteFile beside a stuck stdin: %v", err)
		}
		if free := host.FreeSlots(); free != host.Slots()-2 {
			t.Errorf("stuck stdin holds %d slots, want 2", host.Slots()-free)
		}
		cancel()
		p.Wait()
		testenv.Eventually(t, 10*time.Second, func() bool { return host.FreeSlots() == host.Slots() })
	})

	t.Run("StdinRefsAfterTakeover", func(t *testing.T) {
		// Another host takes the process over while the first still sends
		// input through the ring: the agent gives back every slot the first
		// one sent, and the second's input reaches the process.
		testenv.Eventually(t, 10*time.Second, c.RingStdin)
		p1, info, err := c.StartAttached(ctx, proto.ProcStart{ExecRequest: proto.ExecRequest{Shell: "sleep 2; wc -c"}}, client.IO{Stdin: bytes.NewReader(make([]byte, 32<<20))})
		if err != nil {
			t.Fatalf("StartAttached: %v", err)
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return host.FreeSlots() < host.Slots() })
		var out bytes.Buffer
		p2, _, err := c.Attach(ctx, info.ID, client.IO{Stdout: &out})
		if err != nil {
			t.Fatalf("Attach: %v", err)
		}
		if _, err := p1.Wait(); !errors.Is(err, client.ErrDetached) {
			t.Errorf("first attachment's Wait = %v, want ErrDetached", err)
		}
		testenv.Eventually(t, 10*time.Second, func() bool { return host.FreeSlots() == host.Slots() })
		if err := p2.WriteStdin(bytes.Repeat([]byte("y"), 100<<10)); err != nil {
			t.Fatalf("WriteStdin: %v", err)
		}
		p2.CloseStdin()
		if exit, err := p2.Wait(); err != nil || exit.Code != 0 {
			t.Fatalf("second attachment: %+v, %v", exit, err)
		}
		// wc counts what the process read: some of the first host's
		// bytes (at most what fit in the pipe and the slots it was given)
		// and all of the second's.
		if n, err := strconv.Atoi(strings.TrimSpace(out.String())); err != nil || n < 100<<10 {
			t.Errorf("process read %q bytes, want at least the second host's %d", out.String(), 100<<10)
		}
	})

	t.Run("AbandonedTransfersFreeSlots", func(t *testing.T) {
		// A reader that fails mid-file, a cancelled exec and a writer whose
		// target cannot be made: afterwards every slot is free again on both
		// sides.
		big := make([]byte, 24*ring.SlotSize)
		if _, err := c.WriteFile(ctx, proto.WriteArgs{Path: dir + "/big"}, bytes.NewReader(big)); err != nil {
			t.Fatalf("setup: %v", err)
		}
		if _, err := c.ReadFile(ctx, dir+"/big", failAfter{n: 1}); err == nil {
			t.Errorf("ReadFile into a failing writer = nil, want its error")
		}
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		c.Exec(cctx, proto.ExecRequest{Shell: "cat /dev/zero"}, client.IO{Stdout: slowWriter{}})
		cancel()
		if _, err := c.WriteFile(ctx, proto.WriteArgs{Path: dir + "/no/such/dir/f"}, bytes.NewReader(big)); err == nil {
			t.Errorf("WriteFile into a missing directory = nil, want an error")
		}
		testenv.Eventually(t, 10*time.Second, func() bool {
			return host.FreeSlots() == host.Slots() && guest.FreeSlots() == guest.Slots()
		})
		// And the ring still works.
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, dir+"/big", &got); err != nil || got.Len() != len(big) {
			t.Errorf("ReadFile after the abandoned transfers = %d bytes, %v", got.Len(), err)
		}
	})
}

// TestRingRefusedWithoutDevice: an agent without a ring leaves the client
// working inline.
func TestRingRefusedWithoutDevice(t *testing.T) {
	host, _ := sharedRegions(t, ring.ChunkSize)
	_, c := inProcessWith(t, server.Config{Version: "test"}, client.WithRing(opener(t, host)))
	if c.Ring() {
		t.Errorf("client has a ring with an agent that has none")
	}
	data := bytes.Repeat([]byte("x"), 3*ring.SlotSize)
	path := t.TempDir() + "/f"
	if _, err := c.WriteFile(t.Context(), proto.WriteArgs{Path: path}, bytes.NewReader(data)); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	var got bytes.Buffer
	if _, err := c.ReadFile(t.Context(), path, &got); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Errorf("ReadFile = %d bytes, %v", got.Len(), err)
	}
}

// TestRingTokenMismatch: a host whose region is not the guest's (another
// memory) gets no ring, and no error.
func TestRingTokenMismatch(t *testing.T) {
	host, _ := sharedRegions(t, ring.ChunkSize)
	_, guest := sharedRegions(t, ring.ChunkSize)
	_, c := inProcessWith(t, server.Config{Version: "test", Ring: guest, RingChunks: []uint64{0}}, client.WithRing(opener(t, host)))
	if c.Ring() {
		t.Errorf("client has a ring although the two sides map different memory")
	}
}

// sizedReader hands out r in reads of the given sizes, in turn.
type sizedReader struct {
	r     io.Reader
	sizes []int
	i     int
}

func (s *sizedReader) Read(p []byte) (int, error) {
	n := min(len(p), s.sizes[s.i%len(s.sizes)])
	s.i++
	return s.r.Read(p[:n])
}

type failAfter struct{ n int }

func (f failAfter) Write(p []byte) (int, error) { return 0, io.ErrShortWrite }

type slowWriter struct{}

func (slowWriter) Write(p []byte) (int, error) { time.Sleep(20 * time.Millisecond); return len(p), nil }

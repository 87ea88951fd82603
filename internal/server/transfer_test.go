package server

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
	"space/internal/testenv"
)

// TestBulkRoundTrip1GiB moves 1 GiB of pseudo-random bytes into a sandbox
// and back out again through the API, as a file, as a command's stdout
// and as a command's stdin, and checks they arrive byte-exact; then cuts
// an upload in the middle and checks nothing of it is left in the guest.
func TestBulkRoundTrip1GiB(t *testing.T) {
	testenv.RequireSlow(t)
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{DiskMiB: 4096})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	size := int64(1 << 30)
	if s := os.Getenv("SPACE_TEST_BULK_MIB"); s != "" { // a quicker run by hand
		mib, _ := strconv.Atoi(s)
		size = int64(mib) << 20
	}
	src := &randomBytes{r: rand.NewChaCha8([32]byte{1, 2, 3}), left: size, h: sha256.New()}
	if fw, err := c.WriteFile(ctx, sb.ID, "/root/big", src, client.WriteOptions{}); err != nil || fw.Size != size {
		t.Fatalf("WriteFile(1 GiB) = %+v, %v", fw, err)
	}
	want := src.h.Sum(nil)

	got := sha256.New()
	n := &countingWriter{w: got}
	if _, err := c.ReadFile(ctx, sb.ID, "/root/big", n); err != nil || n.n != size {
		t.Fatalf("ReadFile(1 GiB) = %d bytes, %v", n.n, err)
	}
	if sum := got.Sum(nil); string(sum) != string(want) {
		t.Errorf("ReadFile: sha256 %x, uploaded %x", sum, want)
	}

	got.Reset()
	n = &countingWriter{w: got}
	var stderr strings.Builder
	exit, err := c.Exec(ctx, sb.ID, api.Exec{Command: []string{"cat", "/root/big"}}, n, &stderr)
	if err != nil || exit.Code != 0 || n.n != size {
		t.Fatalf("exec cat (1 GiB) = %+v, %d bytes, %v, stderr %q", exit, n.n, err, stderr.String())
	}
	if sum := got.Sum(nil); string(sum) != string(want) {
		t.Errorf("exec cat: stdout sha256 %x, uploaded %x", sum, want)
	}

	// The same bytes into a command's stdin (binary WebSocket messages),
	// hashed in the guest.
	in := &randomBytes{r: rand.NewChaCha8([32]byte{1, 2, 3}), left: size, h: sha256.New()}
	var sum strings.Builder
	exit, err = c.ExecStream(ctx, sb.ID, api.Exec{Command: []string{"sha256sum"}}, client.StreamIO{Stdin: in, Stdout: &sum, Stderr: &stderr})
	if err != nil || exit.Code != 0 {
		t.Fatalf("exec sha256sum with 1 GiB of stdin = %+v, %v, stderr %q", exit, err, stderr.String())
	}
	if got := strings.Fields(sum.String()); len(got) == 0 || got[0] != fmt.Sprintf("%x", want) {
		t.Errorf("exec sha256sum of 1 GiB of stdin = %q, want %x", sum.String(), want)
	}

	// An upload cut after 300 MiB fails and leaves neither the file nor a
	// part of it behind; the file it would have replaced is intact.
	cut := &randomBytes{r: rand.NewChaCha8([32]byte{4}), left: 400 << 20, failAt: 300 << 20, h: sha256.New()}
	if _, err := c.WriteFile(ctx, sb.ID, "/root/big", cut, client.WriteOptions{}); err == nil {
		t.Errorf("WriteFile from a failing source = nil error")
	}
	var last string
	for deadline := time.Now().Add(30 * time.Second); ; {
		var out strings.Builder
		_, err := c.Exec(ctx, sb.ID, api.Exec{Shell: "ls -a /root | grep -c space-tmp; stat -c %s /root/big"}, &out, nil)
		last = fmt.Sprintf("%q, %v", out.String(), err)
		if err == nil && out.String() == fmt.Sprintf("0\n%d\n", size) {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the agent removes its temporary file once it sees the cut
	}
	if !strings.HasPrefix(last, fmt.Sprintf("%q", fmt.Sprintf("0\n%d\n", size))) {
		t.Errorf("after the cut upload: temporary files and size of the old file = %s, want none and %d", last, size)
	}
}

// randomBytes reads left pseudo-random bytes, hashing what it gives, and
// fails once failAt bytes were read when failAt is set.
type randomBytes struct {
	r      *rand.ChaCha8
	left   int64
	failAt int64
	read   int64
	h      hash.Hash
}

func (r *randomBytes) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	if r.failAt > 0 && r.read >= r.failAt {
		return 0, errors.New("source cut")
	}
	p = p[:min(int64(len(p)), r.left)]
	r.r.Read(p)
	r.h.Write(p)
	r.left -= int64(len(p))
	r.read += int64(len(p))
	return len(p), nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}

// TestSlowReaderBackPressure stalls a client reading a command's output
// and checks that the server does not buffer the output meanwhile (its
// heap stays put while the command could have written 200 MiB), and that
// every byte arrives once the client reads again.
func TestSlowReaderBackPressure(t *testing.T) {
	release := guesttest.AcquireSlot(t)
	defer release()
	ts := startServer(t, "", "")
	ts.deleteAllOnCleanup(t)
	c := ts.client
	ctx := t.Context()
	sb, err := c.CreateSandbox(ctx, api.CreateSandbox{})
	if err != nil {
		t.Fatalf("CreateSandbox = %v", err)
	}
	const size = 200 << 20
	if _, _, code := execOut(t, c, sb.ID, sh(fmt.Sprintf("head -c %d /dev/urandom > /root/out && sha256sum /root/out > /root/sum", size))); code != 0 {
		t.Fatalf("setup: exit %d", code)
	}
	wantSum, _, _ := execOut(t, c, sb.ID, sh("cut -d' ' -f1 /root/sum"))
	var before, during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := sha256.New()
	stalled := false
	out := writerFunc(func(p []byte) (int, error) {
		if !stalled {
			stalled = true
			time.Sleep(8 * time.Second) // the guest could write it all meanwhile
			runtime.GC()
			runtime.ReadMemStats(&during)
		}
		return h.Write(p)
	})
	n := &countingWriter{w: out}
	exit, err := c.Exec(ctx, sb.ID, api.Exec{Command: []string{"cat", "/root/out"}}, n, nil)
	if err != nil || exit.Code != 0 || n.n != size {
		t.Fatalf("exec cat = %+v, %d bytes, %v; want %d", exit, n.n, err, size)
	}
	if got := fmt.Sprintf("%x\n", h.Sum(nil)); got != wantSum {
		t.Errorf("output after the stall: sha256 %s, want %s", got, wantSum)
	}
	grew := int64(during.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap in use before %d MiB, during the stall %d MiB", before.HeapInuse>>20, during.HeapInuse>>20)
	if grew > 64<<20 {
		t.Errorf("the heap grew %d MiB while the reader stalled: output is buffered, not held back", grew>>20)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

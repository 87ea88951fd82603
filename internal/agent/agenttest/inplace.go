package agenttest

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"space/internal/agent/client"
	"space/internal/agent/proto"
)

// testReadInPlace reads files whose bytes the host copies from the guest's
// page cache in place (proto.TypePagesRef): whole, a range that starts
// inside a page, and one truncated and its memory reused while pieces of
// it are pinned, which must yield a prefix of what the file held and
// never bytes of memory reused since.
func testReadInPlace(t *testing.T, c *client.Client, opts Options) {
	deadline := time.Now().Add(5 * time.Second)
	for !c.PageReads() {
		if time.Now().After(deadline) {
			t.Fatalf("the agent offers no page references on this connection")
		}
		time.Sleep(10 * time.Millisecond)
	}
	p := opts.Scratch + "/inplace"
	data := make([]byte, 24<<20+4321)
	rand.Read(data)
	if _, err := c.WriteFile(ctx(t, time.Minute), proto.WriteArgs{Path: p}, bytes.NewReader(data)); err != nil {
		t.Fatalf("WriteFile = %v", err)
	}
	for _, tt := range []struct{ off, length int64 }{{0, 0}, {4097, 5<<20 + 3}, {3<<20 - 1, 0}} {
		var got bytes.Buffer
		_, err := c.ReadFileRange(ctx(t, time.Minute), proto.ReadArgs{Path: p, Offset: tt.off, Length: tt.length}, &got)
		want := data[tt.off:]
		if tt.length > 0 {
			want = want[:tt.length]
		}
		if err != nil || !bytes.Equal(got.Bytes(), want) {
			t.Errorf("ReadFileRange(%d, %d) = %v, %d bytes: want the file's %d bytes", tt.off, tt.length, err, got.Len(), len(want))
		}
	}

	// A directory: its large file goes in place inside the archive.
	dir := opts.Scratch + "/inplace-dir"
	Output(t, c, fmt.Sprintf("rm -rf %[1]s && mkdir %[1]s && cp %[2]s %[1]s/big && echo small > %[1]s/small", dir, p))
	var archive bytes.Buffer
	if _, err := c.TarRead(ctx(t, time.Minute), dir, &archive); err != nil {
		t.Fatalf("TarRead = %v", err)
	}
	files := tarFiles(t, archive.Bytes())
	if !bytes.Equal(files["big"], data) || string(files["small"]) != "small\n" || len(files) != 2 {
		t.Errorf("TarRead: %d entries, big %d bytes (equal %v), small %q", len(files), len(files["big"]), bytes.Equal(files["big"], data), files["small"])
	}

	// The host holds its first piece in a writer that waits; meanwhile
	// the agent has the next pieces pinned. The file is emptied and as
	// much again written elsewhere, so its freed pages are reused.
	gate := &gatedWriter{entered: make(chan struct{}), open: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := c.ReadFile(ctx(t, time.Minute), p, gate)
		done <- err
	}()
	select {
	case <-gate.entered:
	case err := <-done:
		t.Fatalf("ReadFile ended before its first write: %v", err)
	}
	Output(t, c, fmt.Sprintf("truncate -s 0 %[1]s && head -c %[2]d /dev/urandom > %[1]s.fill && sync && rm %[1]s.fill", p, len(data)))
	close(gate.open)
	if err := <-done; err != nil {
		t.Fatalf("ReadFile of a file truncated under it = %v", err)
	}
	got := gate.buf.Bytes()
	if len(got) == 0 || !bytes.Equal(got, data[:len(got)]) {
		t.Fatalf("ReadFile of a file truncated under it: %d bytes, not a prefix of what it held", len(got))
	}
	t.Logf("%d of %d bytes read before the truncation showed", len(got), len(data))
}

// gatedWriter keeps the bytes written to it; its first Write waits until
// open is closed.
type gatedWriter struct {
	entered, open chan struct{}
	buf           bytes.Buffer
	first         bool
}

func (w *gatedWriter) Write(p []byte) (int, error) {
	if !w.first {
		w.first = true
		close(w.entered)
		<-w.open
	}
	return w.buf.Write(p)
}

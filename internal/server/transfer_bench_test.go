package server

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/api"
	"space/client"
	"space/internal/agent/guesttest"
)

// BenchmarkTransferHTTP measures, in one run, bulk bytes through the whole
// path a client takes (HTTP to space server, its embedded worker, the
// agent) against the guest's own rates measured in the same sandbox: exec
// stdout (NDJSON events), file put and get (raw bodies), and the exec
// round trip. The guest's rates: head -c from /dev/zero to /dev/null (the
// reference issue 21 states its goal against), dd of /dev/zero, a pipe,
// and a tmpfs file written and read. BenchmarkTransfer in internal/agent/guesttest measures the
// agent connection alone, so the two together say what each layer costs.
//
//	go test -run '^$' -bench TransferHTTP -benchtime 1x ./internal/server
func BenchmarkTransferHTTP(b *testing.B) {
	release := guesttest.AcquireSlot(b)
	defer release()
	ts := startServerB(b, Config{})
	c := ts.client
	ctx := b.Context()
	var sb api.Sandbox
	var err error
	if sb, err = c.CreateSandbox(ctx, api.CreateSandbox{}); err != nil {
		b.Fatalf("CreateSandbox = %v", err)
	}
	const size = 100 << 20
	shell := func(cmd string) string {
		var out, errOut bytes.Buffer
		if exit, err := c.Exec(ctx, sb.ID, api.Exec{Shell: cmd}, &out, &errOut); err != nil || exit.Code != 0 {
			b.Fatalf("%s: %+v, %v: %s", cmd, exit, err, errOut.String())
		}
		return out.String()
	}
	rate := func(cmd string) float64 {
		line := strings.Split(strings.TrimSpace(shell(cmd+" 2>&1 | tail -1")), ",")
		f := strings.Fields(line[len(line)-1])
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || len(f) != 2 {
			b.Fatalf("%s: no rate in %q", cmd, line)
		}
		switch f[1] {
		case "GB/s":
			v *= 1000
		case "kB/s":
			v /= 1000
		}
		return v
	}
	mbps := func(f func()) float64 {
		t0 := time.Now()
		f()
		return float64(size) / time.Since(t0).Seconds() / 1e6
	}
	// timed is the rate of a guest command that moves size bytes, timed
	// inside the guest (for commands that print no rate of their own).
	timed := func(cmd string) float64 {
		ns, err := strconv.ParseInt(strings.TrimSpace(shell("s=$(date +%s%N); "+cmd+"; e=$(date +%s%N); echo $((e-s))")), 10, 64)
		if err != nil || ns <= 0 {
			b.Fatalf("%s: no time: %v", cmd, err)
		}
		return float64(size) / (float64(ns) / 1e9) / 1e6
	}
	for b.Loop() {
		// The issue's own reference: head's buffer, no pipe.
		head := timed(fmt.Sprintf("head -c %d /dev/zero >/dev/null", size))
		b.ReportMetric(head, "guest-head-MB/s")
		zero := rate(fmt.Sprintf("dd if=/dev/zero of=/dev/null bs=64k count=%d", size>>16))
		pipe := rate(fmt.Sprintf("head -c %d /dev/zero | dd of=/dev/null bs=64k", size))
		write := rate(fmt.Sprintf("dd if=/dev/zero of=/dev/shm/ref bs=256k count=%d", size>>18))
		read := rate("dd if=/dev/shm/ref of=/dev/null bs=256k")
		shell("rm -f /dev/shm/ref")
		b.ReportMetric(zero, "guest-zero-MB/s")
		b.ReportMetric(pipe, "guest-pipe-MB/s")
		b.ReportMetric(write, "guest-file-write-MB/s")
		b.ReportMetric(read, "guest-file-read-MB/s")

		stdout := mbps(func() {
			var n counter
			if exit, err := c.Exec(ctx, sb.ID, api.Exec{Shell: fmt.Sprintf("head -c %d /dev/zero", size)}, &n, nil); err != nil || exit.Code != 0 || n != size {
				b.Fatalf("exec stdout: %d bytes, %+v, %v", n, exit, err)
			}
		})
		b.ReportMetric(stdout, "exec-stdout-MB/s")
		b.ReportMetric(stdout/pipe, "exec-stdout/guest-pipe")
		b.ReportMetric(stdout/head, "exec-stdout/guest-head")
		ndjson := mbps(func() {
			var n counter
			if exit, err := c.ExecEvents(ctx, sb.ID, api.Exec{Shell: fmt.Sprintf("head -c %d /dev/zero", size)}, &n, nil); err != nil || exit.Code != 0 || n != size {
				b.Fatalf("exec stdout (NDJSON): %d bytes, %+v, %v", n, exit, err)
			}
		})
		b.ReportMetric(ndjson, "exec-stdout-ndjson-MB/s")
		data := make([]byte, size)
		stdin := mbps(func() {
			var out bytes.Buffer
			exit, err := c.ExecStream(ctx, sb.ID, api.Exec{Shell: "wc -c"}, client.StreamIO{Stdin: bytes.NewReader(data), Stdout: &out})
			if err != nil || exit.Code != 0 || strings.TrimSpace(out.String()) != strconv.Itoa(size) {
				b.Fatalf("exec stdin: %q, %+v, %v", out.String(), exit, err)
			}
		})
		b.ReportMetric(stdin, "exec-stdin-MB/s")
		b.ReportMetric(stdin/pipe, "exec-stdin/guest-pipe")
		b.ReportMetric(stdin/head, "exec-stdin/guest-head")
		put := mbps(func() {
			if _, err := c.WriteFile(ctx, sb.ID, "/dev/shm/bench", bytes.NewReader(data), client.WriteOptions{}); err != nil {
				b.Fatalf("WriteFile = %v", err)
			}
		})
		b.ReportMetric(put, "file-put-MB/s")
		b.ReportMetric(put/write, "file-put/guest-file-write")
		b.ReportMetric(put/head, "file-put/guest-head")
		get := mbps(func() {
			var n counter
			if _, err := c.ReadFile(ctx, sb.ID, "/dev/shm/bench", &n); err != nil || n != size {
				b.Fatalf("ReadFile: %d bytes, %v", n, err)
			}
		})
		b.ReportMetric(get, "file-get-MB/s")
		b.ReportMetric(get/read, "file-get/guest-file-read")
		b.ReportMetric(get/head, "file-get/guest-head")
		b.ReportMetric(get/zero, "file-get/guest-zero")
		shell("rm -f /dev/shm/bench")
		var rtts []time.Duration
		for range 30 {
			t0 := time.Now()
			if _, err := c.Exec(ctx, sb.ID, api.Exec{Command: []string{"true"}}, nil, nil); err != nil {
				b.Fatalf("exec true: %v", err)
			}
			rtts = append(rtts, time.Since(t0))
		}
		slices.Sort(rtts)
		b.ReportMetric(float64(rtts[len(rtts)/2].Microseconds())/1000, "exec-true-p50-ms")
		b.ReportMetric(float64(rtts[len(rtts)*9/10].Microseconds())/1000, "exec-true-p90-ms")
	}
}

type counter int64

func (n *counter) Write(p []byte) (int, error) { *n += counter(len(p)); return len(p), nil }

package guesttest

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"space/internal/agent/agenttest"
	"space/internal/agent/client"
	"space/internal/agent/proto"
)

// BenchmarkTransfer measures, in one run on one booted guest, how fast
// bytes cross the agent connection against the guest's own rate: the
// guest writing /dev/zero to /dev/null is the reference, and every bulk
// path is reported as a ratio of it. It also reports the exec round trip
// and how busy the VMM was during each transfer (VMM CPU seconds per wall
// second: near 1 per vCPU means the guest is CPU bound; low means waits).
//
//	go test -run '^$' -bench Transfer -benchtime 1x ./internal/agent/guesttest
func BenchmarkTransfer(b *testing.B) {
	vm := Boot(b, Options{VCPUs: 1, MemoryMiB: 512})
	c := vm.Client
	if !c.Ring() {
		b.Logf("the agent connection has no ring: bulk bytes go inline")
	}
	ctx := b.Context()
	const size = 100 << 20
	cpu := func() time.Duration {
		inf, err := vm.VMM.Info()
		if err != nil {
			b.Fatalf("vmm info: %v", err)
		}
		return inf.CPUTime
	}
	// timed runs f and returns its MB/s over n bytes and the VMM's CPU
	// share meanwhile.
	timed := func(n int64, f func()) (mbps, busy float64) {
		c0, t0 := cpu(), time.Now()
		f()
		wall := time.Since(t0)
		return float64(n) / wall.Seconds() / 1e6, float64(cpu()-c0) / float64(wall)
	}
	for b.Loop() {
		// The guest's own rate: dd reports its own elapsed time, without
		// the exec round trip.
		out := agenttest.Output(b, c, fmt.Sprintf("dd if=/dev/zero of=/dev/null bs=64k count=%d 2>&1 | tail -1", size>>16))
		guest, err := ddRate(out)
		if err != nil {
			b.Fatalf("guest rate: %v (%q)", err, out)
		}
		b.ReportMetric(guest, "guest-MB/s")
		// The guest's own rate through a pipe from head, which is what an
		// exec's stdout is.
		out = agenttest.Output(b, c, fmt.Sprintf("head -c %d /dev/zero | dd of=/dev/null bs=64k 2>&1 | tail -1", size))
		pipe, err := ddRate(out)
		if err != nil {
			b.Fatalf("guest pipe rate: %v (%q)", err, out)
		}
		b.ReportMetric(pipe, "guest-pipe-MB/s")

		stdout, stdoutBusy := timed(size, func() {
			var n countWriter
			if _, err := c.Exec(ctx, proto.ExecRequest{Shell: fmt.Sprintf("head -c %d /dev/zero", size)}, client.IO{Stdout: &n}); err != nil || n != size {
				b.Fatalf("exec stdout: %d bytes, %v", n, err)
			}
		})
		b.ReportMetric(stdout, "exec-stdout-MB/s")
		b.ReportMetric(stdout/guest, "exec-stdout/guest")
		b.ReportMetric(stdout/pipe, "exec-stdout/guest-pipe")
		b.ReportMetric(stdoutBusy, "exec-stdout-vmm-busy")

		data := bytes.Repeat([]byte{0x5a}, size)
		if c.Ring() && !c.RingStdin() {
			b.Logf("the agent takes no input through the ring: stdin goes inline")
		}
		stdin, stdinBusy := timed(size, func() {
			var out bytes.Buffer
			if _, err := c.Exec(ctx, proto.ExecRequest{Shell: "wc -c"}, client.IO{Stdin: bytes.NewReader(data), Stdout: &out}); err != nil || strings.TrimSpace(out.String()) != strconv.Itoa(size) {
				b.Fatalf("exec stdin: %q, %v", out.String(), err)
			}
		})
		b.ReportMetric(stdin, "exec-stdin-MB/s")
		b.ReportMetric(stdin/guest, "exec-stdin/guest")
		b.ReportMetric(stdin/pipe, "exec-stdin/guest-pipe")
		b.ReportMetric(stdinBusy, "exec-stdin-vmm-busy")

		put, putBusy := timed(size, func() {
			if _, err := c.WriteFile(ctx, proto.WriteArgs{Path: "/dev/shm/bench", NoSync: true}, bytes.NewReader(data)); err != nil {
				b.Fatalf("write file: %v", err)
			}
		})
		b.ReportMetric(put, "file-put-MB/s")
		b.ReportMetric(put/guest, "file-put/guest")
		b.ReportMetric(putBusy, "file-put-vmm-busy")

		get, getBusy := timed(size, func() {
			var n countWriter
			if _, err := c.ReadFile(ctx, "/dev/shm/bench", &n); err != nil || n != size {
				b.Fatalf("read file: %d bytes, %v", n, err)
			}
		})
		b.ReportMetric(get, "file-get-MB/s")
		b.ReportMetric(get/guest, "file-get/guest")
		b.ReportMetric(getBusy, "file-get-vmm-busy")
		agenttest.Output(b, c, "rm -f /dev/shm/bench")
		bigFiles(b, c, guest, timed)

		spawn := agenttest.Output(b, c, "s=$(date +%s%N); for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done; e=$(date +%s%N); echo $(( (e-s)/10000 ))")
		if v, err := strconv.ParseFloat(strings.TrimSpace(spawn), 64); err == nil {
			b.ReportMetric(v/100, "guest-spawn-ms")
		}
		var rtts []time.Duration
		for range 30 {
			t0 := time.Now()
			if _, err := c.Exec(ctx, proto.ExecRequest{Argv: []string{"true"}}, client.IO{}); err != nil {
				b.Fatalf("exec true: %v", err)
			}
			rtts = append(rtts, time.Since(t0))
		}
		slices.Sort(rtts)
		b.ReportMetric(float64(rtts[len(rtts)/2].Microseconds())/1000, "exec-true-p50-ms")
		b.ReportMetric(float64(rtts[len(rtts)*9/10].Microseconds())/1000, "exec-true-p90-ms")
		// A terminal's echo, idle and while a download from the same
		// guest runs (TestPTYDuringBulkTransfer checks they interleave).
		idleEcho, busyEcho := ptyEchoes(b, c)
		b.ReportMetric(float64(idleEcho.Microseconds())/1000, "pty-echo-idle-p50-ms")
		b.ReportMetric(float64(busyEcho.Microseconds())/1000, "pty-echo-download-p50-ms")
		b.ReportMetric(float64(busyEcho)/float64(idleEcho), "pty-echo-download/idle")
		var health []time.Duration
		for range 30 {
			t0 := time.Now()
			if _, err := c.Health(ctx); err != nil {
				b.Fatalf("health: %v", err)
			}
			health = append(health, time.Since(t0))
		}
		slices.Sort(health)
		b.ReportMetric(float64(health[len(health)/2].Microseconds())/1000, "health-p50-ms")
	}
}

// bigFiles reports file put and get of 1 GiB, which a 512 MiB guest
// keeps on its disk: put until the bytes are in the page cache (no sync),
// get while most of them must come back from the disk.
func bigFiles(b *testing.B, c *client.Client, guest float64, timed func(int64, func()) (float64, float64)) {
	const big = 1 << 30
	const path = "/root/bench-1g"
	free, err := strconv.ParseInt(strings.TrimSpace(agenttest.Output(b, c, "df -B1 --output=avail /root | tail -1")), 10, 64)
	if err != nil || free < big+big/4 {
		b.Logf("1 GiB files not measured: %d bytes free on the guest's disk (%v)", free, err)
		return
	}
	defer agenttest.Output(b, c, "rm -f "+path)
	put, _ := timed(big, func() {
		if _, err := c.WriteFile(b.Context(), proto.WriteArgs{Path: path, NoSync: true}, io.LimitReader(zeros{}, big)); err != nil {
			b.Fatalf("write 1 GiB: %v", err)
		}
	})
	b.ReportMetric(put, "file-put-1GiB-MB/s")
	b.ReportMetric(put/guest, "file-put-1GiB/guest")
	// The guest's own read of it, from its disk as the get below.
	const dropCaches = "sync && echo 3 > /proc/sys/vm/drop_caches"
	disk, err := ddRate(agenttest.Output(b, c, fmt.Sprintf("%s && dd if=%s of=/dev/null bs=1M 2>&1 | tail -1", dropCaches, path)))
	if err != nil {
		b.Fatalf("guest disk read: %v", err)
	}
	b.ReportMetric(disk, "guest-disk-read-MB/s")
	agenttest.Output(b, c, dropCaches)
	get, _ := timed(big, func() {
		var n countWriter
		if _, err := c.ReadFile(b.Context(), path, &n); err != nil || n != big {
			b.Fatalf("read 1 GiB: %d bytes, %v", n, err)
		}
	})
	b.ReportMetric(get, "file-get-1GiB-MB/s")
	b.ReportMetric(get/guest, "file-get-1GiB/guest")
	b.ReportMetric(get/disk, "file-get-1GiB/guest-disk-read")
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// ptyEchoes returns the median echo of a guest terminal, idle and during
// a download of a large file from the same guest.
func ptyEchoes(b *testing.B, c *client.Client) (idle, download time.Duration) {
	term := openTerminal(b, c)
	defer func() { term.p.Signal(9); term.p.Wait() }()
	var lat []time.Duration
	for i := range 11 { // the first waits for the shell
		d, err := term.echo(b.Context(), i)
		if err != nil {
			b.Fatalf("echo: %v", err)
		}
		lat = append(lat, d)
	}
	lat = lat[1:]
	slices.Sort(lat)
	busy, _, ended := echoesDuringDownload(b, c, term, 100)
	if ended {
		b.Logf("the download ended before the echoes: not measured during it")
	}
	return lat[len(lat)/2], busy[len(busy)/2]
}

// ddRate parses the rate of dd's last line ("... copied, 0.61 s, 110 MB/s")
// into MB/s.
func ddRate(line string) (float64, error) {
	f := strings.Split(strings.TrimSpace(line), ",")
	if len(f) < 3 {
		return 0, fmt.Errorf("no rate in dd output")
	}
	r := strings.Fields(f[len(f)-1])
	if len(r) != 2 {
		return 0, fmt.Errorf("no rate in dd output")
	}
	v, err := strconv.ParseFloat(r[0], 64)
	if err != nil {
		return 0, err
	}
	switch r[1] {
	case "kB/s":
		return v / 1e3, nil
	case "MB/s":
		return v, nil
	case "GB/s":
		return v * 1e3, nil
	}
	return 0, fmt.Errorf("unknown unit %q", r[1])
}

type countWriter int64

func (n *countWriter) Write(p []byte) (int, error) { *n += countWriter(len(p)); return len(p), nil }

var _ io.Writer = (*countWriter)(nil)

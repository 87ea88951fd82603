package firecracker

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/proc"
	"space/internal/vmm"
)

func TestParseStat(t *testing.T) {
	// Fields 3.. of a real stat line; the command name holds ") (".
	line := "4242 (fire) (cracker) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 50 0 0 20 0 9 0 123456 1000000 200 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0"
	got, err := parseStat([]byte(line))
	if err != nil {
		t.Fatalf("parseStat: %v", err)
	}
	want := procStat{state: 'S', cpu: 2 * time.Second, startTime: 123456}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(procStat{})); diff != "" {
		t.Errorf("parseStat (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"", "4242 fire S 1", "4242 (fire) S 1 2 3"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantOK  bool
		wantErr bool
	}{
		{in: "Name:\tfc\nVmRSS:\t  2048 kB\nThreads: 3\n", want: 2 << 20, wantOK: true},
		{in: "Name:\tfc\nState:\tZ (zombie)\n"},
		{in: "VmRSS: lots\n", wantErr: true},
	}
	for _, tt := range tests {
		got, ok, err := proc.ParseVmRSS([]byte(tt.in))
		if got != tt.want || ok != tt.wantOK || (err != nil) != tt.wantErr {
			t.Errorf("proc.ParseVmRSS(%q) = %d, %v, %v; want %d, %v, error %v", tt.in, got, ok, err, tt.want, tt.wantOK, tt.wantErr)
		}
	}
}

// TestAttachProcess watches a process that is not ours to reap (a child
// of a shell that outlives it) through a pidfd.
func TestAttachProcess(t *testing.T) {
	// sh starts sleep in the background, prints its pid and waits for
	// stdin to close; sleep is sh's child, not ours.
	sh := exec.Command("/bin/sh", "-c", "sleep 60 & echo $!; read x; kill $! 2>/dev/null")
	stdin, err := sh.StdinPipe()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if err := sh.Start(); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Cleanup(func() {
		stdin.Close()
		sh.Wait()
	})
	buf := make([]byte, 32)
	n, err := out.Read(buf)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	var pid int
	for _, c := range strings.TrimSpace(string(buf[:n])) {
		pid = pid*10 + int(c-'0')
	}
	st, err := readStat(pid)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := attachProcess(pid, st.startTime+1); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("attachProcess with another start time = %v, want ErrGone", err)
	}
	p, err := attachProcess(pid, st.startTime)
	if err != nil {
		t.Fatalf("attachProcess: %v", err)
	}
	if p.exited() {
		t.Fatalf("attached process reads as exited")
	}
	if err := p.signal(syscall.SIGTERM); err != nil {
		t.Fatalf("signal: %v", err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("exit of an attached process not seen")
	}
	if err := p.signal(syscall.SIGKILL); err != nil {
		t.Errorf("signal after exit = %v, want nil", err)
	}
	if _, err := attachProcess(os.Getpid(), 1); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("attachProcess(self, wrong start time) = %v, want ErrGone", err)
	}
}

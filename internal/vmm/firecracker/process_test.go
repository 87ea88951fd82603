package firecracker

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"space/internal/proc"
	"space/internal/vmm"
)

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
	st, err := proc.ReadStat(pid)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if _, err := attachProcess(pid, st.StartTime+1); !errors.Is(err, vmm.ErrGone) {
		t.Errorf("attachProcess with another start time = %v, want ErrGone", err)
	}
	p, err := attachProcess(pid, st.StartTime)
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

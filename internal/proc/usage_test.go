package proc

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseVmRSS(t *testing.T) {
	status := "Name:\tqemu-system-x86\nVmPeak:\t  999 kB\nVmRSS:\t   264128 kB\nThreads:\t5\n"
	rss, ok, err := ParseVmRSS([]byte(status))
	if err != nil || !ok || rss != 264128*1024 {
		t.Errorf("ParseVmRSS() = %d, %v, %v, want %d, true, nil", rss, ok, err, 264128*1024)
	}
	_, ok, err = ParseVmRSS([]byte("Name:\tzombie\nState:\tZ (zombie)\n"))
	if ok || err != nil {
		t.Errorf("ParseVmRSS(zombie) = _, %v, %v, want false, nil", ok, err)
	}
	if _, _, err := ParseVmRSS([]byte("VmRSS:\t12 MB\n")); err == nil {
		t.Error("ParseVmRSS(bad unit) = nil error, want error")
	}

	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if rss, ok, err := ParseVmRSS(b); err != nil || !ok || rss <= 0 {
		t.Errorf("ParseVmRSS(/proc/self/status) = %d, %v, %v, want positive", rss, ok, err)
	}
}

func TestParsePssAndMemAvailable(t *testing.T) {
	for _, f := range []string{"/proc/self/smaps_rollup", "/proc/meminfo"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("setup: %v", err)
		}
		var n int64
		if f == "/proc/meminfo" {
			n, err = ParseMemAvailable(b)
		} else {
			var ok bool
			if n, ok, err = ParsePss(b); !ok && err == nil {
				err = fmt.Errorf("no Pss line")
			}
		}
		if err != nil || n <= 0 {
			t.Errorf("parse %s = %d, %v; want positive", f, n, err)
		}
	}
	if _, err := ParseMemAvailable([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Error("ParseMemAvailable(no line) = nil error")
	}
	if n, err := ParseMemFree([]byte("MemTotal: 4 kB\nMemFree: 3 kB\n")); err != nil || n != 3<<10 {
		t.Errorf("ParseMemFree = %d, %v; want 3072", n, err)
	}
	if _, err := ParseMemFree([]byte("MemTotal: 1 kB\n")); err == nil {
		t.Error("ParseMemFree(no line) = nil error")
	}
}

func TestParseCPUTime(t *testing.T) {
	// Fields: pid (comm) state ppid pgrp session tty tpgid flags minflt
	// cminflt majflt cmajflt utime stime ...
	stat := "4242 (qemu (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 5 0\n"
	got, err := ParseCPUTime([]byte(stat))
	if want := 3250 * time.Millisecond; err != nil || got != want {
		t.Errorf("ParseCPUTime() = %v, %v, want %v, nil", got, err, want)
	}
	if _, err := ParseCPUTime([]byte("4242 (short) S 1 2")); err == nil {
		t.Error("ParseCPUTime(truncated) = nil error, want error")
	}

	// Burn CPU until the kernel has charged us a few clock ticks (on a
	// loaded machine wall time says little about CPU time).
	for start := time.Now(); time.Since(start) < 10*time.Second; {
		_ = strings.Repeat("x", 1000)
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		if time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) > 50*time.Millisecond {
			break
		}
	}
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if got, err := ParseCPUTime(b); err != nil || got <= 0 {
		t.Errorf("ParseCPUTime(/proc/self/stat) = %v, %v, want positive", got, err)
	}
}

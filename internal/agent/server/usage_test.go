package server

import (
	"testing"

	"space/internal/agent/proto"
)

func TestParseUsage(t *testing.T) {
	var u proto.GuestUsage
	stat := "cpu  100 5 50 1000 20 1 2 3 7 0\ncpu0 50 2 25 500 10 0 1 1 0 0\ncpu1 50 3 25 500 10 1 1 2 0 0\nintr 1 2 3\n"
	if err := parseStat([]byte(stat), &u); err != nil {
		t.Fatal(err)
	}
	// busy: user nice system irq softirq steal = 100+5+50+1+2+3; total adds idle and iowait.
	if u.CPUs != 2 || u.CPUBusy != 161 || u.CPUTotal != 1181 {
		t.Errorf("stat: cpus %d busy %d total %d, want 2 161 1181", u.CPUs, u.CPUBusy, u.CPUTotal)
	}
	if err := parseStat([]byte("intr 1\n"), &u); err == nil {
		t.Error("a /proc/stat without a cpu line parsed")
	}
	parseMeminfo([]byte("MemTotal:        1000 kB\nMemFree: 10 kB\nMemAvailable:     600 kB\nCached:     200 kB\n"), &u)
	if u.MemTotal != 1000<<10 || u.MemUsed != 400<<10 || u.MemCache != 200<<10 {
		t.Errorf("meminfo: total %d used %d cache %d", u.MemTotal, u.MemUsed, u.MemCache)
	}
	dev := "Inter-|   Receive                                                |  Transmit\n" +
		" face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n" +
		"    lo:    999       9    0    0    0     0          0         0      999       9    0    0    0     0       0          0\n" +
		"  eth0:   1500      10    0    0    0     0          0         0      2500      20    0    0    0     0       0          0\n"
	parseNetDev([]byte(dev), &u)
	if u.NetRx != 1500 || u.NetTx != 2500 {
		t.Errorf("net/dev: rx %d tx %d, want 1500 2500 (loopback left out)", u.NetRx, u.NetTx)
	}
	if got := readUsage(); got == nil || got.CPUs == 0 || got.MemTotal == 0 || got.DiskTotal == 0 {
		t.Errorf("readUsage of this host = %+v", got)
	}
}

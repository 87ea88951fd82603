package server

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
)

// readUsage reads the guest's counters for a health answer: three small
// files of /proc and one statfs, so a heartbeat every few seconds costs
// the guest next to nothing. Nil if /proc is not readable.
func readUsage() *proto.GuestUsage {
	var u proto.GuestUsage
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	if err := parseStat(stat, &u); err != nil {
		return nil
	}
	if mem, err := os.ReadFile("/proc/meminfo"); err == nil {
		parseMeminfo(mem, &u)
	}
	if dev, err := os.ReadFile("/proc/net/dev"); err == nil {
		parseNetDev(dev, &u)
	}
	var fs unix.Statfs_t
	if unix.Statfs("/", &fs) == nil && fs.Bsize > 0 {
		bs := uint64(fs.Bsize)
		u.DiskTotal = fs.Blocks * bs
		u.DiskUsed = (fs.Blocks - fs.Bfree) * bs
	}
	return &u
}

// parseStat reads the total CPU line and counts the per-CPU lines of
// /proc/stat.
func parseStat(b []byte, u *proto.GuestUsage) error {
	sc := bufio.NewScanner(bytes.NewReader(b))
	seen := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "cpu") {
			break // the cpu lines come first
		}
		f := strings.Fields(line)
		if f[0] != "cpu" {
			u.CPUs++
			continue
		}
		// user nice system idle iowait irq softirq steal (guest times are
		// in user and nice already).
		for i, v := range f[1:min(len(f), 9)] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return fmt.Errorf("/proc/stat: %q", line)
			}
			u.CPUTotal += n
			if i != 3 && i != 4 {
				u.CPUBusy += n
			}
		}
		seen = true
	}
	if !seen {
		return fmt.Errorf("/proc/stat: no cpu line")
	}
	return nil
}

// parseMeminfo reads MemTotal, MemAvailable and Cached.
func parseMeminfo(b []byte, u *proto.GuestUsage) {
	var avail uint64
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			u.MemTotal = n << 10
		case "MemAvailable:":
			avail = n << 10
		case "Cached:":
			u.MemCache = n << 10
		}
	}
	if avail <= u.MemTotal {
		u.MemUsed = u.MemTotal - avail
	}
}

// parseNetDev sums the received and sent bytes of every interface but
// loopback.
func parseNetDev(b []byte, u *proto.GuestUsage) {
	for line := range strings.SplitSeq(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		rx, err1 := strconv.ParseUint(f[0], 10, 64)
		tx, err2 := strconv.ParseUint(f[8], 10, 64)
		if err1 == nil && err2 == nil {
			u.NetRx += rx
			u.NetTx += tx
		}
	}
}

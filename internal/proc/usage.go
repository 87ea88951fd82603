package proc

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat (USER_HZ, fixed
// at 100 in the Linux ABI).
const userHZ = 100

// ParseVmRSS returns VmRSS in bytes from the contents of /proc/<pid>/status.
// ok is false when the line is missing (a zombie has none).
func ParseVmRSS(status []byte) (rss int64, ok bool, err error) {
	return parseKB(status, "VmRSS")
}

// ParsePss returns Pss in bytes from the contents of
// /proc/<pid>/smaps_rollup: the process's resident memory with each page
// it shares with others counted in part. ok is false when the line is
// missing.
func ParsePss(rollup []byte) (pss int64, ok bool, err error) {
	return parseKB(rollup, "Pss")
}

// ParseMemAvailable returns MemAvailable in bytes from the contents of
// /proc/meminfo.
func ParseMemAvailable(meminfo []byte) (int64, error) { return meminfoField(meminfo, "MemAvailable") }

// ParseMemFree returns MemFree in bytes from the contents of /proc/meminfo.
func ParseMemFree(meminfo []byte) (int64, error) { return meminfoField(meminfo, "MemFree") }

// meminfoField returns the field key of /proc/meminfo in bytes; a missing
// one is an error.
func meminfoField(meminfo []byte, key string) (int64, error) {
	n, ok, err := parseKB(meminfo, key)
	if err == nil && !ok {
		err = fmt.Errorf("no %s in meminfo", key)
	}
	return n, err
}

// parseKB returns the value of the first "key: N kB" line in bytes.
func parseKB(b []byte, key string) (n int64, ok bool, err error) {
	prefix := []byte(key + ":")
	for line := range bytes.Lines(b) {
		rest, found := bytes.CutPrefix(line, prefix)
		if !found {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) != 2 || f[1] != "kB" {
			return 0, false, fmt.Errorf("parse %s %q", key, bytes.TrimSpace(line))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("parse %s: %w", key, err)
		}
		return kb << 10, true, nil
	}
	return 0, false, nil
}

// ParseCPUTime returns utime+stime of all threads from the contents of
// /proc/<pid>/stat.
func ParseCPUTime(stat []byte) (time.Duration, error) {
	// The command name (field 2) is in parentheses and may hold spaces or
	// parentheses itself; the fields after the last ')' are plain.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse stat: no command name")
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state), so utime (field 14) is f[11], stime f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("parse stat: %d fields after the command name", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / userHZ), nil
}

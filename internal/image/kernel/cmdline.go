package kernel

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// fastArgs shorten a guest boot: no self-tests, no legacy devices probed,
// no timer calibration loops, one serial port for the console.
var fastArgs = []string{
	"console=ttyS0", "quiet", "tsc=reliable", "no_timer_check", "cryptomgr.notests",
	"mitigations=off", "8250.nr_uarts=1", "i8042.noaux", "i8042.nokbd", "i8042.nopnp",
	"i8042.dumbkbd", "audit=0", "random.trust_cpu=on", "nowatchdog", "panic=-1",
}

// Cmdline returns the kernel command line for a SPACE guest: the fast-boot
// arguments, the host's TSC rate when it can be read (without it, TSC
// calibration fails on machines with no HPET or PM timer, such as microvm
// under TCG), then extra (the agent's space.* keys).
func Cmdline(extra ...string) string {
	args := append([]string(nil), fastArgs...)
	if khz := hostTSCKHz(); khz > 0 {
		args = append(args, "tsc_early_khz="+strconv.Itoa(khz))
	}
	return strings.Join(append(args, extra...), " ")
}

// hostTSCKHz reads the CPU clock from /proc/cpuinfo, or 0.
func hostTSCKHz() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 {
			return 0
		}
		return int(mhz * 1000)
	}
	return 0
}

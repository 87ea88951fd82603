package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path/filepath"
	"strconv"

	"space/internal/errkind"
)

// Limits are a group's resource limits. The zero value limits nothing.
type Limits struct {
	// CPUs is the CPU bandwidth in CPUs (1.5 = one and a half CPUs' time
	// per period); 0 is unlimited. At least 0.01.
	CPUs float64
	// MemoryBytes caps the group's memory; 0 is unlimited. The group may
	// not swap while it is set (where the kernel accounts swap).
	MemoryBytes int64
	// Pids caps the number of tasks (threads count); 0 is unlimited.
	Pids int64
}

const (
	// cpuPeriod is the CFS bandwidth period in microseconds (the kernel
	// default).
	cpuPeriod = 100_000
	// minCPUQuota is the kernel's smallest quota in microseconds.
	minCPUQuota = 1_000
	// maxCPUs bounds CPUs so its quota stays far from overflowing.
	maxCPUs = 1 << 16
)

// validate checks l's values alone, not whether the host can apply them.
func (l Limits) validate() error {
	why := ""
	switch {
	case math.IsNaN(l.CPUs) || l.CPUs < 0 || l.CPUs > maxCPUs:
		why = fmt.Sprintf("cpus %g out of range [0, %d]", l.CPUs, maxCPUs)
	case l.CPUs > 0 && cpuQuota(l.CPUs) < minCPUQuota:
		why = fmt.Sprintf("cpus %g below the minimum %g", l.CPUs, float64(minCPUQuota)/cpuPeriod)
	case l.MemoryBytes < 0:
		why = fmt.Sprintf("memory %d negative", l.MemoryBytes)
	case l.Pids < 0:
		why = fmt.Sprintf("pids %d negative", l.Pids)
	}
	if why != "" {
		return fmt.Errorf("limits: %s: %w", why, errkind.InvalidArgument)
	}
	return nil
}

// check validates l and checks that h has the controllers it needs.
func (h *Hierarchy) check(l Limits) error {
	if err := l.validate(); err != nil {
		return err
	}
	for _, need := range []struct {
		set bool
		c   Controller
	}{{l.CPUs > 0, CPU}, {l.MemoryBytes > 0, Memory}, {l.Pids > 0, Pids}} {
		if need.set && !h.has(need.c) {
			return fmt.Errorf("%s limit: %w", need.c, ErrNoController)
		}
	}
	return nil
}

// cpuQuota returns the CFS quota in microseconds per cpuPeriod for cpus,
// -1 for unlimited.
func cpuQuota(cpus float64) int64 {
	if cpus == 0 {
		return -1
	}
	return int64(math.Round(cpus * cpuPeriod))
}

// cpuMax formats cgroup v2 cpu.max: "$QUOTA $PERIOD" or "max $PERIOD".
func cpuMax(cpus float64) string {
	q := cpuQuota(cpus)
	if q < 0 {
		return "max " + strconv.Itoa(cpuPeriod)
	}
	return strconv.FormatInt(q, 10) + " " + strconv.Itoa(cpuPeriod)
}

// maxValue formats a v2 limit (memory.max, pids.max; also v1 pids.max):
// "max" for 0 (unlimited), else the number.
func maxValue(n int64) string {
	if n == 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
}

// v1Value formats a v1 limit in bytes or microseconds: -1 for 0.
func v1Value(n int64) string {
	if n == 0 {
		return "-1"
	}
	return strconv.FormatInt(n, 10)
}

// swapMax formats v2 memory.swap.max for a memory limit: no swap while
// memory is limited (or the limit leaks into swap), unlimited otherwise.
func swapMax(memory int64) string {
	if memory == 0 {
		return "max"
	}
	return "0"
}

// apply writes every limit whose controller h has.
func (g *Group) apply(l Limits) error {
	if g.h.version == 2 {
		return g.applyV2(l)
	}
	return g.applyV1(l)
}

func (g *Group) applyV2(l Limits) error {
	dir := g.unified()
	if g.h.has(CPU) {
		if err := writeFile(filepath.Join(dir, "cpu.max"), cpuMax(l.CPUs)); err != nil {
			return err
		}
	}
	if g.h.has(Memory) {
		if err := writeFile(filepath.Join(dir, "memory.max"), maxValue(l.MemoryBytes)); err != nil {
			return err
		}
		// memory.swap.max exists only where the kernel accounts swap.
		err := writeFile(filepath.Join(dir, "memory.swap.max"), swapMax(l.MemoryBytes))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if g.h.has(Pids) {
		if err := writeFile(filepath.Join(dir, "pids.max"), maxValue(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

func (g *Group) applyV1(l Limits) error {
	if g.h.has(CPU) {
		dir := g.dir(CPU)
		if err := writeFile(filepath.Join(dir, "cpu.cfs_period_us"), strconv.Itoa(cpuPeriod)); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, "cpu.cfs_quota_us"), strconv.FormatInt(cpuQuota(l.CPUs), 10)); err != nil {
			return err
		}
	}
	if g.h.has(Memory) {
		if err := setV1Memory(g.dir(Memory), v1Value(l.MemoryBytes)); err != nil {
			return err
		}
	}
	if g.h.has(Pids) {
		if err := writeFile(filepath.Join(g.dir(Pids), "pids.max"), maxValue(l.Pids)); err != nil {
			return err
		}
	}
	return nil
}

// setV1Memory sets memory.limit_in_bytes and, where swap is accounted,
// memory.memsw.limit_in_bytes (memory plus swap) to the same value, so the
// group cannot swap. The kernel keeps limit <= memsw at every step: a
// lower limit goes first, a higher one after memsw is raised.
func setV1Memory(dir, value string) error {
	limit := filepath.Join(dir, "memory.limit_in_bytes")
	memsw := filepath.Join(dir, "memory.memsw.limit_in_bytes")
	err := writeFile(limit, value)
	if !exists(memsw) {
		return err
	}
	if err != nil {
		// Raising: memsw first, then the limit again. If memsw refuses
		// too, the limit's error says why.
		if writeFile(memsw, value) != nil {
			return err
		}
		return writeFile(limit, value)
	}
	return writeFile(memsw, value)
}

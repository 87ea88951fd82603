// Package guestsys applies host requests that change the guest as a whole:
// its clock, RNG, hostname, machine and boot IDs, network addresses and
// power. It is the agent's server.System inside a VM and must never run
// on a host.
package guestsys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/agent/server"
	"space/internal/errkind"
	"space/internal/proc"
)

var (
	_ server.System     = (*System)(nil)
	_ server.Identifier = (*System)(nil)
	_ server.Reclaimer  = (*System)(nil)
)

// System implements server.System for the guest the agent runs in.
type System struct {
	log *slog.Logger
	// beforePowerOff runs after every process is gone and before the
	// power-off syscall (the agent unmounts here). nil = just sync.
	beforePowerOff func()
}

// New returns the guest's System. beforePowerOff may be nil.
func New(log *slog.Logger, beforePowerOff func()) *System {
	return &System{log: log, beforePowerOff: beforePowerOff}
}

// ReclaimMemory drops the guest's clean caches (page cache, dentries and
// inodes) and compacts free memory into whole blocks, which the balloon
// device's free page reporting then hands back to the host. Dirty pages
// and the memory of processes stay.
func (s *System) ReclaimMemory() (proto.Reclaimed, error) {
	var r proto.Reclaimed
	var err error
	if r.FreeBefore, err = memFree(); err != nil {
		return r, err
	}
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return r, fmt.Errorf("drop caches: %w", err)
	}
	// A kernel without compaction has no file: the drop alone still frees
	// what it frees, in smaller pieces.
	if err := os.WriteFile("/proc/sys/vm/compact_memory", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("compact memory: %w", err)
	}
	r.FreeAfter, err = memFree()
	return r, err
}

func memFree() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return proc.ParseMemFree(b)
}

// SetClock sets the wall clock.
func (s *System) SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

// rndAddEntropy is RNDADDENTROPY, _IOW('R', 0x03, int[2]);
// rndReseedCRNG is RNDRESEEDCRNG, _IO('R', 0x07).
const (
	rndAddEntropy = 0x40085203
	rndReseedCRNG = 0x5207
)

// AddEntropy mixes seed into the kernel RNG, credits it and reseeds the
// kernel's generator from it, so a clone's RNG diverges from its
// siblings' at once. A credit alone reseeds only while the RNG is not yet
// ready; once it is, the kernel reseeds on its own schedule (every 60 s
// after the first two minutes of uptime), and until then a restored
// kernel's generator would go on from its origin's state.
func (s *System) AddEntropy(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(seed)+3)
	*(*int32)(unsafe.Pointer(&buf[0])) = int32(len(seed) * 8)
	*(*int32)(unsafe.Pointer(&buf[4])) = int32(len(seed))
	copy(buf[8:], seed)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); errno != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", errno)
	}
	return nil
}

// SetHostname sets the kernel hostname and /etc/hostname.
func (s *System) SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	return writeAtomic("/etc/hostname", []byte(name+"\n"))
}

// machineIDFiles are where a guest's software reads its machine-id:
// systemd's file and D-Bus's older one. The second is replaced only where
// it is a file of its own (Debian links it to the first).
var machineIDFiles = []string{"/etc/machine-id", "/var/lib/dbus/machine-id"}

// SetMachineID writes id to the guest's machine-id files.
func (s *System) SetMachineID(id string) error {
	if err := writeAtomicMode(machineIDFiles[0], []byte(id+"\n"), 0o444); err != nil {
		return err
	}
	for _, p := range machineIDFiles[1:] {
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if err := writeAtomicMode(p, []byte(id+"\n"), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// bootIDFile is where the kernel shows the boot_id it drew when it
// booted. A restored kernel is a copy of the one that booted, so it shows
// its origin's.
const bootIDFile = "/proc/sys/kernel/random/boot_id"

// SetBootID bind-mounts a read-only file holding id over the kernel's
// boot_id, after removing what earlier calls (in this guest or in the
// one it was restored from) mounted there. Every process of the agent's
// mount namespace, running or started later, then reads id; a process
// that mounts a procfs of its own sees the kernel's.
func (s *System) SetBootID(id string) error {
	for range 16 {
		// EINVAL once the path is no mount point: the kernel's file.
		if err := unix.Unmount(bootIDFile, unix.MNT_DETACH); err != nil {
			break
		}
	}
	f, err := os.CreateTemp("/run", ".space-boot-id-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // the mount holds the file
	_, err = f.WriteString(id + "\n")
	if err == nil {
		err = f.Chmod(0o444)
	}
	if err = errors.Join(err, f.Close()); err != nil {
		return err
	}
	if err := unix.Mount(f.Name(), bootIDFile, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", f.Name(), bootIDFile, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("", bootIDFile, "", flags, ""); err != nil {
		return errors.Join(fmt.Errorf("make %s read-only: %w", bootIDFile, err), unix.Unmount(bootIDFile, unix.MNT_DETACH))
	}
	return nil
}

// BootID is the boot_id the guest's processes read.
func (s *System) BootID() (string, error) {
	b, err := os.ReadFile(bootIDFile)
	return strings.TrimSpace(string(b)), err
}

// ConfigureNetwork gives each interface (found by MAC) exactly the addresses
// in cfg, brings it up, sets the default route and the resolver.
func (s *System) ConfigureNetwork(ctx context.Context, cfg proto.NetConfig) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, ifc := range cfg.Interfaces {
		mac, _ := net.ParseMAC(ifc.MAC)
		var link netlink.Link
		for _, l := range links {
			if l.Attrs().HardwareAddr.String() == mac.String() {
				link = l
			}
		}
		if link == nil {
			return fmt.Errorf("no interface with mac %s: %w", ifc.MAC, errkind.NotFound)
		}
		if err := configureLink(link, ifc); err != nil {
			return fmt.Errorf("configure %s: %w", link.Attrs().Name, err)
		}
	}
	if len(cfg.Nameservers) > 0 {
		var b strings.Builder
		for _, ns := range cfg.Nameservers {
			fmt.Fprintf(&b, "nameserver %s\n", ns)
		}
		if err := writeAtomic("/etc/resolv.conf", []byte(b.String())); err != nil {
			return err
		}
	}
	return nil
}

func configureLink(link netlink.Link, ifc proto.Interface) error {
	if ifc.MTU != 0 {
		if err := netlink.LinkSetMTU(link, ifc.MTU); err != nil {
			return fmt.Errorf("set mtu: %w", err)
		}
	}
	old, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range old {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("remove address %s: %w", a.IPNet, err)
		}
	}
	for _, cidr := range ifc.Addresses {
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		if a.IP.To4() == nil {
			a.Flags |= unix.IFA_F_NODAD // the link is the sandbox's own
		}
		if err := netlink.AddrAdd(link, a); err != nil {
			return fmt.Errorf("add address %s: %w", cidr, err)
		}
	}
	if err := noOffloads(link.Attrs().Name); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("link up: %w", err)
	}
	if ifc.Gateway != "" {
		gw := net.ParseIP(ifc.Gateway)
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	if ifc.Gateway6 != "" {
		gw := net.ParseIP(ifc.Gateway6)
		if gw == nil || gw.To4() != nil {
			return fmt.Errorf("gateway6 %q is not an IPv6 address: %w", ifc.Gateway6, errkind.InvalidArgument)
		}
		_, all, _ := net.ParseCIDR("::/0")
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: all, Gw: gw, Family: netlink.FAMILY_V6}
		if err := netlink.RouteReplace(route); err != nil {
			return fmt.Errorf("IPv6 default route via %s: %w", gw, err)
		}
	}
	return nil
}

// PowerOff ends every process (SIGTERM, then SIGKILL after a grace), syncs
// and powers off. It returns only on failure.
func (s *System) PowerOff(reboot bool) error {
	unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && othersAlive() {
		time.Sleep(50 * time.Millisecond)
	}
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	if s.beforePowerOff != nil {
		s.beforePowerOff()
	}
	unix.Sync()
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	if reboot || !canPowerOff() {
		// Without ACPI (Firecracker's microVMs) a power-off only halts the
		// guest and the VMM runs on; a reset ends the VMM instead.
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	err := unix.Reboot(cmd)
	if err != nil && !reboot {
		// Some VMMs (Firecracker) have no power-off device; a reset
		// ends them instead.
		s.log.Warn("power off failed, resetting", "err", err)
		err = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	}
	return fmt.Errorf("reboot: %w", err)
}

// canPowerOff reports whether the machine has a power-off device (ACPI).
func canPowerOff() bool {
	_, err := os.Stat("/sys/firmware/acpi")
	return err == nil
}

// othersAlive reports whether any process but PID 1 and kernel threads is
// left.
func othersAlive() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		if e.Name() == "1" || e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		// Kernel threads have an empty cmdline.
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			return true
		}
	}
	return false
}

// writeAtomic replaces the file at path with data, making its directory
// if the image has none (a minimal OCI image may lack /etc).
func writeAtomic(path string, data []byte) error { return writeAtomicMode(path, data, 0o644) }

// writeAtomicMode is writeAtomic of a file with mode perm.
func writeAtomicMode(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".space-tmp")
	os.Remove(tmp) // a leftover: WriteFile keeps an existing file's mode
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}

// noOffloads turns off the interface's transmit checksum and segmentation
// offloads: the far end of a guest NIC is the sandbox's gateway, which
// takes only whole frames of the link's size with their checksums (a
// gateway on a tap reads what the kernel got from the VMM as is). A
// device without them is fine as it is.
func noOffloads(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	type ethtoolValue struct{ cmd, data uint32 }
	type ifreqData struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [24 - unsafe.Sizeof(uintptr(0))]byte
	}
	for _, cmd := range []uint32{unix.ETHTOOL_STSO, unix.ETHTOOL_SGSO, unix.ETHTOOL_STXCSUM} {
		v := &ethtoolValue{cmd: cmd}
		req := &ifreqData{data: unsafe.Pointer(v)}
		copy(req.name[:], name)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(req)))
		if errno != 0 && errno != unix.EOPNOTSUPP {
			return fmt.Errorf("%s: turn offload %#x off: %w", name, cmd, errno)
		}
	}
	return nil
}

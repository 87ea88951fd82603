package qemu

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"space/internal/errkind"
	"space/internal/vmm"
)

// AgentPort is the name of the virtio-serial port that carries the guest
// agent channel; the guest finds it under /sys/class/virtio-ports/*/name.
const AgentPort = "space.agent"

// Names of the files Boot creates in Spec.Dir.
const (
	memoryFile   = "memory"      // guest RAM, a sparse file mapped shared
	qmpSocket    = "qmp.sock"    // QMP monitor
	serialSocket = "serial.sock" // first serial port (the guest console)
	agentSocket  = "agent.sock"  // the AgentPort virtio-serial port
	serialLog    = "serial.log"  // console output, capped; kept after Stop
	stderrLog    = "qemu.log"    // QEMU's stderr, capped; kept after Stop
)

const (
	defaultSerialLogLimit = 1 << 20
	stderrLogLimit        = 256 << 10
	// maxSocketPath is the longest path a unix socket address can hold
	// (sun_path is 108 bytes including the terminating NUL).
	maxSocketPath = 107
	// tcgCacheMiB caps TCG's translation cache (QEMU's default is 1 GiB).
	tcgCacheMiB = 128
)

// Spec describes one VM to boot.
type Spec struct {
	// Dir is the VM's private run directory for sockets, the memory file
	// and logs. Boot creates it with mode 0700 if missing; it must not hold
	// a memory file already. Guest RAM is a shared mapping of Dir/memory, so
	// Dir belongs on tmpfs (e.g. under /dev/shm or /run), or guest memory
	// writes end up being written back to disk. Dir must be short enough for
	// unix socket paths (about 95 bytes).
	Dir string
	// Kernel is the guest kernel (bzImage or PVH ELF vmlinux). Required.
	Kernel string
	// Initrd is the initramfs, or "" for none.
	Initrd string
	// Cmdline is the kernel command line, or "" for none.
	Cmdline string
	// VCPUs is the number of virtual CPUs; 0 means 1.
	VCPUs int
	// MemoryMiB is the guest RAM size in MiB. Required.
	MemoryMiB int
	// Disks are attached as virtio-blk devices in order, so the guest sees
	// them as /dev/vda, /dev/vdb, ...; or nil for none.
	Disks []Disk
	// SerialLogLimit caps Dir/serial.log in bytes; 0 means 1 MiB. The guest
	// controls this output: bytes past the limit are discarded and counted.
	SerialLogLimit int64
	// Accel is the accelerator: "" or "tcg" for TCG, or "kvm".
	Accel string
	// Paused leaves the vCPUs stopped (QMP status "prelaunch") when Boot
	// returns, until the caller sends the QMP command cont.
	Paused bool
	// Incoming starts QEMU waiting for a migration stream (-incoming
	// defer): the caller loads device state over QMP (Restore does).
	Incoming bool
	// NIC is the guest's network interface, or nil for none.
	NIC *NIC
	// Vsock adds a vhost-vsock device, or nil for none (the agent then
	// uses the virtio-serial port).
	Vsock *Vsock
	// Placer puts the QEMU process in its control group as it starts, or
	// nil.
	Placer vmm.Placer `json:"-"`
	// MemoryFrom is a memory file to start from (a snapshot's); it is
	// copied (reflinked where possible) to the memory path. "" = fresh RAM.
	MemoryFrom string
	// MoveMemory moves MemoryFrom to the memory path instead of copying
	// it (reflink.Move).
	MoveMemory bool
	// MemoryPath is the guest RAM's file, mapped shared; "" = Dir/memory.
	MemoryPath string
}

// NIC is a virtio-net interface on an open tap descriptor, or on a unix
// socket QEMU listens on (a stream netdev) for a userspace network stack.
// Start hands a tap descriptor to QEMU; the caller keeps (and closes) its
// own.
type NIC struct {
	Tap    *os.File `json:"-"`
	Socket string   // instead of Tap
	MAC    string
}

// Vsock is a vhost-vsock device on an open /dev/vhost-vsock descriptor
// whose guest CID is already set (see OpenVsock). The caller keeps (and
// closes) its descriptor.
type Vsock struct {
	CID uint32
	FD  *os.File `json:"-"`
}

// Disk is one virtio-blk disk.
type Disk struct {
	Path     string
	Format   string // "raw" or "qcow2"; QEMU never probes the format
	ReadOnly bool
}

// invalid wraps errkind.InvalidArgument around a spec problem.
func invalid(format string, args ...any) error {
	return fmt.Errorf("invalid spec: "+format+": %w", append(args, errkind.InvalidArgument)...)
}

// normalize validates s and returns it with defaults filled in and Dir made
// absolute. It checks that the kernel, initrd and disks exist.
func (s Spec) normalize() (Spec, error) {
	if s.Dir == "" {
		return s, invalid("dir not set")
	}
	dir, err := filepath.Abs(s.Dir)
	if err != nil {
		return s, invalid("dir: %v", err)
	}
	s.Dir = dir
	if s.MemoryPath != "" {
		if s.MemoryPath, err = filepath.Abs(s.MemoryPath); err != nil {
			return s, invalid("memory path: %v", err)
		}
	}
	if n := len(filepath.Join(dir, serialSocket)); n > maxSocketPath {
		return s, invalid("dir %s too long for unix sockets (%d bytes, limit %d)", dir, n, maxSocketPath)
	}
	if s.Kernel == "" {
		return s, invalid("kernel not set")
	}
	if err := checkFile("kernel", s.Kernel); err != nil {
		return s, err
	}
	if s.Initrd != "" {
		if err := checkFile("initrd", s.Initrd); err != nil {
			return s, err
		}
	}
	switch {
	case s.VCPUs == 0:
		s.VCPUs = 1
	case s.VCPUs < 0:
		return s, invalid("vcpus %d is negative", s.VCPUs)
	}
	if s.MemoryMiB <= 0 {
		return s, invalid("memory %d MiB, want a positive size", s.MemoryMiB)
	}
	for i, d := range s.Disks {
		if d.Path == "" {
			return s, invalid("disk %d: path not set", i)
		}
		if d.Format != "raw" && d.Format != "qcow2" {
			return s, invalid("disk %d: format %q, want raw or qcow2", i, d.Format)
		}
		if err := checkFile("disk "+strconv.Itoa(i), d.Path); err != nil {
			return s, err
		}
	}
	if s.NIC != nil {
		if (s.NIC.Tap == nil) == (s.NIC.Socket == "") {
			return s, invalid("nic needs a tap descriptor or a socket path, not both")
		}
		if strings.ContainsRune(s.NIC.Socket, ',') {
			return s, invalid("nic socket %q has a comma", s.NIC.Socket)
		}
		if _, err := net.ParseMAC(s.NIC.MAC); err != nil || strings.ContainsRune(s.NIC.MAC, ',') {
			return s, invalid("nic mac %q", s.NIC.MAC)
		}
	}
	switch {
	case s.SerialLogLimit == 0:
		s.SerialLogLimit = defaultSerialLogLimit
	case s.SerialLogLimit < 0:
		return s, invalid("serial log limit %d is negative", s.SerialLogLimit)
	}
	switch s.Accel {
	case "":
		s.Accel = "tcg"
	case "tcg", "kvm":
	default:
		return s, invalid("accel %q, want tcg or kvm", s.Accel)
	}
	return s, nil
}

func checkFile(what, path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("invalid spec: %s: %w: %w", what, err, errkind.InvalidArgument)
	}
	if !fi.Mode().IsRegular() && fi.Mode()&os.ModeDevice == 0 {
		return invalid("%s %s is not a file", what, path)
	}
	return nil
}

func (s Spec) path(name string) string { return filepath.Join(s.Dir, name) }

// memoryPath is where the guest's RAM file is.
func (s Spec) memoryPath() string {
	if s.MemoryPath != "" {
		return s.MemoryPath
	}
	return s.path(memoryFile)
}

// sandboxArg confines QEMU with seccomp. spawn=deny rules out the exec:
// migration transport; snapshots pass a descriptor with getfd instead.
const sandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// Descriptors of the listening sockets Boot binds and hands to QEMU, in
// ExtraFiles order (fd 3 is the first entry).
const (
	qmpFD    = 3
	serialFD = 4
	agentFD  = 5
	nicFD    = 6 // only with a NIC: its tap, or its listening socket
)

// args returns QEMU's arguments for a normalized spec. The vCPUs always
// start stopped (-S): Boot attaches the serial console first so no output is
// lost, then sends cont unless s.Paused.
//
// The device set and order must stay identical between a VM and any clone
// restored from its snapshot; only host-side paths may differ.
func (s Spec) args(sandbox bool) []string { return s.argsWith(sandbox, nil) }

// argsWith is args with some file paths replaced: QEMU running as another
// user gets its files as inherited descriptors, named /proc/self/fd/N.
func (s Spec) argsWith(sandbox bool, paths map[string]string) []string {
	p := func(path string) string {
		if q, ok := paths[path]; ok {
			return q
		}
		return path
	}
	a := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-msg", "timestamp=on",
	}
	if sandbox {
		a = append(a, "-sandbox", sandboxArg)
	}
	accel := s.Accel
	if s.Accel == "tcg" {
		// QEMU's default translation cache is 1 GiB per VM; a small guest
		// runs well on far less, and many of them must fit on one host.
		accel += ",tb-size=" + strconv.Itoa(tcgCacheMiB)
		if s.VCPUs > 1 {
			accel += ",thread=multi"
		}
	}
	mem := strconv.Itoa(s.MemoryMiB) + "M"
	a = append(a,
		"-machine", "q35,memory-backend=mem",
		"-accel", accel,
		"-cpu", "max",
		"-smp", strconv.Itoa(s.VCPUs),
		"-m", mem,
		"-object", "memory-backend-file,id=mem,size="+mem+",mem-path="+optEscape(p(s.memoryPath()))+",share=on",
		// -kernel, -initrd and -append take their value verbatim.
		"-kernel", p(s.Kernel),
	)
	if s.Initrd != "" {
		a = append(a, "-initrd", p(s.Initrd))
	}
	if s.Cmdline != "" {
		a = append(a, "-append", s.Cmdline)
	}
	a = append(a,
		"-chardev", "socket,id=qmp,fd="+strconv.Itoa(qmpFD)+",server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "socket,id=ser0,fd="+strconv.Itoa(serialFD)+",server=on,wait=off",
		"-serial", "chardev:ser0",
		"-device", "virtio-serial-pci,id=vser0",
		"-chardev", "socket,id=agent,fd="+strconv.Itoa(agentFD)+",server=on,wait=off",
		"-device", "virtserialport,bus=vser0.0,chardev=agent,name="+AgentPort,
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-pci,rng=rng0",
		// Free page reporting: pages the guest frees go back to the host
		// (and leave holes in the memory file, which keeps snapshots small).
		"-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on",
	)
	switch {
	case s.NIC != nil && s.NIC.Socket != "":
		// QEMU listens (on a socket Start made and hands it); the
		// gateway connects, and may again after a restart of the worker.
		a = append(a,
			"-netdev", "stream,id=n0,server=on,addr.type=fd,addr.str="+strconv.Itoa(nicFD),
			"-device", "virtio-net-pci,netdev=n0,mac="+s.NIC.MAC,
		)
	case s.NIC != nil:
		a = append(a,
			"-netdev", "tap,id=n0,fd="+strconv.Itoa(nicFD),
			"-device", "virtio-net-pci,netdev=n0,mac="+s.NIC.MAC,
		)
	}
	if s.Vsock != nil {
		a = append(a, "-device", "vhost-vsock-pci,id=vsock0,guest-cid="+strconv.FormatUint(uint64(s.Vsock.CID), 10)+",vhostfd="+strconv.Itoa(s.vsockFD()))
	}
	for i, d := range s.Disks {
		id := "d" + strconv.Itoa(i)
		ro := "off"
		if d.ReadOnly {
			ro = "on"
		}
		// cache=writeback: the host page cache absorbs writes, and a
		// guest's flush (fsync) reaches the disk, so what the guest (or
		// the agent, for an acknowledged file write) made durable stays
		// durable across a host crash.
		a = append(a,
			"-drive", "if=none,id="+id+",file="+optEscape(p(d.Path))+",format="+d.Format+",readonly="+ro+",cache=writeback",
			"-device", "virtio-blk-pci,drive="+id,
		)
	}
	if s.Incoming {
		a = append(a, "-incoming", "defer")
	}
	return append(a, "-S")
}

// optEscape escapes a value inside a QEMU option list, where "," separates
// options and ",," stands for a literal comma.
func optEscape(v string) string { return strings.ReplaceAll(v, ",", ",,") }

// vsockFD is the descriptor number QEMU inherits the vhost-vsock device
// as: right after the sockets and the tap.
func (s Spec) vsockFD() int {
	if s.NIC != nil {
		return nicFD + 1
	}
	return nicFD
}

// closeTap closes the caller's copy of the tap descriptor, if any.
func (n *NIC) closeTap() {
	if n.Tap != nil {
		n.Tap.Close()
	}
}

// guestMemory is the guest's RAM file and where q35 puts it: all of it
// from address 0 when it fits below the PCI hole, else the part below
// the hole there and the rest from 4 GiB (QEMU's pc_q35_init).
func (s Spec) guestMemory() *vmm.GuestMemory {
	ram := uint64(s.MemoryMiB) << 20
	lowmem := uint64(0xb0000000)
	if ram >= lowmem {
		lowmem = 0x80000000
	}
	m := &vmm.GuestMemory{Path: s.memoryPath()}
	if ram <= lowmem {
		m.Ranges = []vmm.MemRange{{GPA: 0, Offset: 0, Size: ram}}
		return m
	}
	m.Ranges = []vmm.MemRange{{GPA: 0, Offset: 0, Size: lowmem}, {GPA: 4 << 30, Offset: int64(lowmem), Size: ram - lowmem}}
	return m
}

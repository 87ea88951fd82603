package firecracker

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"space/internal/errkind"
	"space/internal/vmm"
)

// AgentPort is the guest vsock port the agent listens on.
const AgentPort uint32 = 1024

// Names in Firecracker's root (see the package doc) and in the run dir.
const (
	apiSocket   = "fc.sock"
	vsockSocket = "vsock.sock"
	logFIFO     = "vmm.fifo"
	kernelName  = "vmlinux"
	initrdName  = "initrd"
	consoleLog  = "console.log"
	vmmLog      = "firecracker.log"
)

const (
	guestCID = 3
	nicID    = "eth0"
	// maxDevices is the MMIO device limit on x86 since 1.15.
	maxDevices = 17
	// maxCmdline is Firecracker's x86 command line size, including what it
	// appends: root=, pci=off and one virtio_mmio.device= per device.
	maxCmdline = 2048
	// maxSocketPath is sun_path without its terminating NUL.
	maxSocketPath = 107
)

// Layout is the VM's machine and devices as Firecracker sees them. A
// snapshot records it; a restore must provide the same.
type Layout struct {
	VCPUs         int          `json:"vcpus"`
	MemoryMiB     int          `json:"memory_mib"`
	DirtyTracking bool         `json:"dirty_tracking,omitempty"`
	BootArgs      string       `json:"boot_args,omitempty"`
	Disks         []DiskLayout `json:"disks"`
	NIC           *NICLayout   `json:"nic,omitempty"`
	Vsock         VsockLayout  `json:"vsock"`
	Entropy       bool         `json:"entropy"`
	Balloon       bool         `json:"balloon,omitempty"` // with free page reporting, never inflated
}

// DiskLayout is one drive.
type DiskLayout struct {
	ID       string `json:"id"`
	Path     string `json:"path"` // relative to Firecracker's root
	ReadOnly bool   `json:"read_only"`
	Root     bool   `json:"root,omitempty"` // Firecracker's root device (root= appended)
}

// NICLayout is the network interface.
type NICLayout struct {
	ID      string `json:"id"`
	TapName string `json:"tap_name"`
	MAC     string `json:"mac,omitempty"`
}

// VsockLayout is the vsock device and the agent's port on it.
type VsockLayout struct {
	GuestCID uint32 `json:"guest_cid"`
	Path     string `json:"path"` // relative to Firecracker's root
	Port     uint32 `json:"port"`
}

var macPattern = regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`)

// normalize checks spec and fills defaults. forBoot requires what only a
// boot needs (kernel, memory); a restore takes those from the snapshot.
func normalize(spec vmm.Spec, forBoot bool) (vmm.Spec, error) {
	bad := func(format string, args ...any) (vmm.Spec, error) {
		return spec, fmt.Errorf("vm spec: "+format+": %w", append(args, errkind.InvalidArgument)...)
	}
	if spec.RunDir == "" {
		return bad("run dir is required")
	}
	dir, err := filepath.Abs(spec.RunDir)
	if err != nil {
		return bad("run dir: %v", err)
	}
	spec.RunDir = dir
	if forBoot {
		if spec.Kernel == "" {
			return bad("kernel is required")
		}
		if spec.MemoryMiB <= 0 {
			return bad("memory is required")
		}
		if spec.VCPUs == 0 {
			spec.VCPUs = 1
		}
	}
	if spec.VCPUs < 0 || spec.VCPUs > 32 {
		return bad("%d vcpus: want 1 to 32", spec.VCPUs)
	}
	if spec.MemoryMiB < 0 {
		return bad("memory %d MiB", spec.MemoryMiB)
	}
	for _, p := range []*string{&spec.Kernel, &spec.Initrd} {
		if *p != "" {
			if *p, err = filepath.Abs(*p); err != nil {
				return bad("%v", err)
			}
		}
	}
	spec.Disks = append([]vmm.Disk(nil), spec.Disks...)
	for i := range spec.Disks {
		if spec.Disks[i].Path == "" {
			return bad("disk %d has no path", i)
		}
		if spec.Disks[i].Path, err = filepath.Abs(spec.Disks[i].Path); err != nil {
			return bad("%v", err)
		}
	}
	devices := len(spec.Disks) + 2 // + vsock + entropy
	if spec.NIC != nil {
		nic := *spec.NIC
		spec.NIC = &nic
		devices++
		if nic.Socket != "" {
			// Firecracker's NICs are taps only (the driver says so with
			// vmm.TapNICs): the worker's gateway sits on the tap's
			// host side.
			return spec, fmt.Errorf("nic: firecracker has no socket network backend (use a tap): %w", errkind.FailedPrecondition)
		}
		if nic.TapName == "" || len(nic.TapName) > 15 || strings.ContainsAny(nic.TapName, "/ \t\n") {
			return bad("tap name %q", nic.TapName)
		}
		if nic.MAC != "" && !macPattern.MatchString(nic.MAC) {
			return bad("mac %q", nic.MAC)
		}
	}
	if devices > maxDevices {
		return bad("%d devices (disks, network, vsock, entropy): firecracker allows %d", devices, maxDevices)
	}
	return spec, nil
}

// firecrackerDefaults are the parts of Firecracker's default command line
// that a custom one would lose, less two: 8250.nr_uarts=0 (no console)
// and nomodule. Each is added only if the caller did not set its key.
var firecrackerDefaults = []string{
	"console=ttyS0", "reboot=k", "panic=1",
	"i8042.noaux", "i8042.nomux", "i8042.dumbkbd", "swiotlb=noforce",
}

// bootArgs returns the command line to give Firecracker: the caller's,
// the defaults it lacks, and the agent's transport keys (last, so they
// win). Arguments after "--" stay last: they belong to init.
func bootArgs(cmdline string) string {
	fields := strings.Fields(cmdline)
	var initArgs []string
	for i, f := range fields {
		if f == "--" {
			fields, initArgs = fields[:i], fields[i:]
			break
		}
	}
	have := make(map[string]bool)
	for _, f := range fields {
		k, _, _ := strings.Cut(f, "=")
		have[k] = true
	}
	args := append([]string(nil), fields...)
	for _, a := range firecrackerDefaults {
		if k, _, _ := strings.Cut(a, "="); !have[k] {
			args = append(args, a)
		}
	}
	args = append(args, "space.transport=vsock", "space.vsock_port="+strconv.FormatUint(uint64(AgentPort), 10))
	return strings.Join(append(args, initArgs...), " ")
}

// bootLayout is the layout Boot gives Firecracker for spec.
func bootLayout(spec vmm.Spec, dirtyTracking bool) (Layout, error) {
	l := Layout{
		VCPUs:         spec.VCPUs,
		MemoryMiB:     spec.MemoryMiB,
		DirtyTracking: dirtyTracking,
		BootArgs:      bootArgs(spec.Cmdline),
		Vsock:         VsockLayout{GuestCID: guestCID, Path: vsockSocket, Port: AgentPort},
		Entropy:       true,
	}
	for i, d := range spec.Disks {
		// With an initramfs the guest mounts its root itself; without
		// one the first disk is the kernel's root device.
		l.Disks = append(l.Disks, DiskLayout{ID: diskID(i), Path: diskID(i), ReadOnly: d.ReadOnly, Root: i == 0 && spec.Initrd == ""})
	}
	if spec.NIC != nil {
		l.NIC = &NICLayout{ID: nicID, TapName: spec.NIC.TapName, MAC: spec.NIC.MAC}
	}
	devices := len(l.Disks) + 2
	if l.NIC != nil {
		devices++
	}
	// Room for " root=/dev/vda ro", " pci=off" and one
	// " virtio_mmio.device=4K@0xd0000000:5" per device.
	if n := len(l.BootArgs) + 32 + 40*devices; n > maxCmdline {
		return l, fmt.Errorf("vm spec: command line of %d bytes leaves too little room in firecracker's %d: %w", len(l.BootArgs), maxCmdline, errkind.InvalidArgument)
	}
	return l, nil
}

func diskID(i int) string { return "d" + strconv.Itoa(i) }

// placement is a file Firecracker opens by a name in its root.
type placement struct {
	src      string // the caller's file, absolute
	name     string // in Firecracker's root
	writable bool   // Firecracker opens it read-write
	linkOnly bool   // jailed: never copy (too big, or must be shared)
}

// bootFiles returns the files Boot places in Firecracker's root and the
// kernel and initrd paths to give Firecracker. Unjailed, the boot files
// are used in place.
func bootFiles(spec vmm.Spec, jailed bool) (files []placement, kernel, initrd string) {
	kernel, initrd = spec.Kernel, spec.Initrd
	if jailed {
		files = append(files, placement{src: spec.Kernel, name: kernelName})
		kernel = kernelName
		if spec.Initrd != "" {
			files = append(files, placement{src: spec.Initrd, name: initrdName})
			initrd = initrdName
		}
	}
	return append(files, diskFiles(spec)...), kernel, initrd
}

func diskFiles(spec vmm.Spec) []placement {
	var files []placement
	for i, d := range spec.Disks {
		files = append(files, placement{src: d.Path, name: diskID(i), writable: !d.ReadOnly, linkOnly: !d.ReadOnly})
	}
	return files
}

// instanceID derives Firecracker's --id from the run dir: its base name,
// made safe (letters, digits, '-'), and a hash of the whole path so that
// two run dirs never share an id (and, jailed, a chroot).
func instanceID(runDir string) string {
	var b strings.Builder
	for _, r := range filepath.Base(runDir) {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		case r == '_' || r == '.':
			b.WriteByte('-')
		}
		if b.Len() == 32 {
			break
		}
	}
	name := strings.Trim(b.String(), "-")
	if name == "" {
		name = "vm"
	}
	sum := sha256.Sum256([]byte(runDir))
	return name + "-" + hex.EncodeToString(sum[:6])
}

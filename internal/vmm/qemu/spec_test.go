package qemu

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
)

func TestArgs(t *testing.T) {
	tests := []struct {
		name    string
		spec    Spec
		sandbox bool
		want    []string
	}{
		{
			name: "tcg smp disks",
			spec: Spec{
				Dir:       "/run/space/vm1",
				Kernel:    "/cache/vmlinux",
				Initrd:    "/cache/initrd.cpio",
				Cmdline:   "console=ttyS0 quiet panic=-1",
				VCPUs:     2,
				MemoryMiB: 512,
				Disks: []Disk{
					{Path: "/img/root,v1.ext4", Format: "raw", ReadOnly: true},
					{Path: "/run/space/vm1/scratch.qcow2", Format: "qcow2"},
				},
				Accel: "tcg",
			},
			sandbox: true,
			want: []string{
				"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
				"-msg", "timestamp=on",
				"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
				"-machine", "q35,memory-backend=mem",
				"-accel", "tcg,tb-size=128,thread=multi",
				"-cpu", "max",
				"-smp", "2",
				"-m", "512M",
				"-object", "memory-backend-file,id=mem,size=512M,mem-path=/run/space/vm1/memory,share=on",
				"-kernel", "/cache/vmlinux",
				"-initrd", "/cache/initrd.cpio",
				"-append", "console=ttyS0 quiet panic=-1",
				"-chardev", "socket,id=qmp,fd=3,server=on,wait=off",
				"-mon", "chardev=qmp,mode=control",
				"-chardev", "socket,id=ser0,fd=4,server=on,wait=off",
				"-serial", "chardev:ser0",
				"-device", "virtio-serial-pci,id=vser0",
				"-chardev", "socket,id=agent,fd=5,server=on,wait=off",
				"-device", "virtserialport,bus=vser0.0,chardev=agent,name=space.agent",
				"-object", "rng-random,id=rng0,filename=/dev/urandom",
				"-device", "virtio-rng-pci,rng=rng0",
				"-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on",
				"-drive", "if=none,id=d0,file=/img/root,,v1.ext4,format=raw,readonly=on,cache=writeback",
				"-device", "virtio-blk-pci,drive=d0",
				"-drive", "if=none,id=d1,file=/run/space/vm1/scratch.qcow2,format=qcow2,readonly=off,cache=writeback",
				"-device", "virtio-blk-pci,drive=d1",
				"-S",
			},
		},
		{
			name: "kvm minimal without sandbox",
			spec: Spec{
				Dir:       "/run/vm,2",
				Kernel:    "/k",
				VCPUs:     1,
				MemoryMiB: 256,
				Accel:     "kvm",
				Paused:    true, // vCPUs start stopped either way
			},
			want: []string{
				"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
				"-msg", "timestamp=on",
				"-machine", "q35,memory-backend=mem",
				"-accel", "kvm",
				"-cpu", "max",
				"-smp", "1",
				"-m", "256M",
				"-object", "memory-backend-file,id=mem,size=256M,mem-path=/run/vm,,2/memory,share=on",
				"-kernel", "/k",
				"-chardev", "socket,id=qmp,fd=3,server=on,wait=off",
				"-mon", "chardev=qmp,mode=control",
				"-chardev", "socket,id=ser0,fd=4,server=on,wait=off",
				"-serial", "chardev:ser0",
				"-device", "virtio-serial-pci,id=vser0",
				"-chardev", "socket,id=agent,fd=5,server=on,wait=off",
				"-device", "virtserialport,bus=vser0.0,chardev=agent,name=space.agent",
				"-object", "rng-random,id=rng0,filename=/dev/urandom",
				"-device", "virtio-rng-pci,rng=rng0",
				"-device", "virtio-balloon-pci,id=balloon0,free-page-reporting=on",
				"-S",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.spec.args(tt.sandbox)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("args() mismatch (-want +got):\n%s", diff)
			}
			for _, a := range got {
				if strings.Contains(a, "netdev") || strings.Contains(a, "-net") {
					t.Errorf("args() has a network option %q", a)
				}
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatalf("setup: %v", err)
	}
	valid := Spec{Dir: filepath.Join(dir, "vm"), Kernel: file, MemoryMiB: 128}

	got, err := valid.normalize()
	if err != nil {
		t.Fatalf("normalize(valid) = %v", err)
	}
	want := valid
	want.VCPUs = 1
	want.SerialLogLimit = 1 << 20
	want.Accel = "tcg"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("normalize(valid) mismatch (-want +got):\n%s", diff)
	}

	tests := []struct {
		name     string
		edit     func(s *Spec)
		alsoWant error // besides errkind.InvalidArgument
	}{
		{"no dir", func(s *Spec) { s.Dir = "" }, nil},
		{"dir too long", func(s *Spec) { s.Dir = "/" + strings.Repeat("d", 100) }, nil},
		{"no kernel", func(s *Spec) { s.Kernel = "" }, nil},
		{"missing kernel", func(s *Spec) { s.Kernel = filepath.Join(dir, "nope") }, fs.ErrNotExist},
		{"kernel is a dir", func(s *Spec) { s.Kernel = dir }, nil},
		{"missing initrd", func(s *Spec) { s.Initrd = filepath.Join(dir, "nope") }, fs.ErrNotExist},
		{"zero memory", func(s *Spec) { s.MemoryMiB = 0 }, nil},
		{"negative vcpus", func(s *Spec) { s.VCPUs = -1 }, nil},
		{"disk without path", func(s *Spec) { s.Disks = []Disk{{Format: "raw"}} }, nil},
		{"disk format", func(s *Spec) { s.Disks = []Disk{{Path: file, Format: "vmdk"}} }, nil},
		{"disk format empty", func(s *Spec) { s.Disks = []Disk{{Path: file}} }, nil},
		{"missing disk", func(s *Spec) { s.Disks = []Disk{{Path: filepath.Join(dir, "nope"), Format: "raw"}} }, fs.ErrNotExist},
		{"negative serial limit", func(s *Spec) { s.SerialLogLimit = -1 }, nil},
		{"unknown accel", func(s *Spec) { s.Accel = "hvf" }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := valid
			tt.edit(&s)
			_, err := s.normalize()
			if !errors.Is(err, errkind.InvalidArgument) {
				t.Fatalf("normalize() = %v, want an InvalidArgument error", err)
			}
			if tt.alsoWant != nil && !errors.Is(err, tt.alsoWant) {
				t.Errorf("normalize() = %v, want it to wrap %v", err, tt.alsoWant)
			}
		})
	}
}

func TestNewMissingBinary(t *testing.T) {
	_, err := New(Config{Binary: "/nonexistent/qemu-system-x86_64"})
	if !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("New(missing binary) = %v, want a FailedPrecondition error", err)
	}
}

func TestArgsDevicesWithNICAndVsock(t *testing.T) {
	s := Spec{Dir: "/run/vm", Kernel: "/k", MemoryMiB: 64, VCPUs: 1, Accel: "tcg",
		NIC:   &NIC{MAC: "02:fc:00:00:00:01"},
		Vsock: &Vsock{CID: 1234}}
	got := strings.Join(s.args(false), " ")
	for _, want := range []string{
		"-netdev tap,id=n0,fd=6 -device virtio-net-pci,netdev=n0,mac=02:fc:00:00:00:01",
		"-device vhost-vsock-pci,id=vsock0,guest-cid=1234,vhostfd=7",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("args = %q, want them to contain %q", got, want)
		}
	}
	s.NIC = nil
	if got := strings.Join(s.args(false), " "); !strings.Contains(got, "vhostfd=6") {
		t.Errorf("args without a NIC = %q, want vhostfd=6", got)
	}
	// The user files that follow the sockets, tap and vsock are named by
	// descriptor.
	got = strings.Join(s.argsWith(false, map[string]string{"/k": "/proc/self/fd/7"}), " ")
	if !strings.Contains(got, "-kernel /proc/self/fd/7") {
		t.Errorf("argsWith = %q, want the kernel by descriptor", got)
	}
}

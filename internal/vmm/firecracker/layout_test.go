package firecracker

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"space/internal/errkind"
	"space/internal/vmm"
)

func TestBootArgs(t *testing.T) {
	const agent = "space.transport=vsock space.vsock_port=1024"
	tests := []struct {
		name, in, want string
	}{
		{
			name: "empty gets firecracker's defaults with a console",
			in:   "",
			want: "console=ttyS0 reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce " + agent,
		},
		{
			name: "the caller's keys win",
			in:   "console=hvc0 panic=-1 reboot=t i8042.noaux i8042.nokbd quiet",
			want: "console=hvc0 panic=-1 reboot=t i8042.noaux i8042.nokbd quiet i8042.nomux i8042.dumbkbd swiotlb=noforce " + agent,
		},
		{
			name: "agent keys go last so that they win",
			in:   "space.transport=virtio-serial space.port=space.agent console=ttyS0 reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce",
			want: "space.transport=virtio-serial space.port=space.agent console=ttyS0 reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce " + agent,
		},
		{
			name: "init arguments stay after --",
			in:   "console=ttyS0 reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce -- --verbose",
			want: "console=ttyS0 reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce " + agent + " -- --verbose",
		},
		{
			name: "extra spaces collapse",
			in:   "  quiet\t console=ttyS0  reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce ",
			want: "quiet console=ttyS0 reboot=k panic=1 i8042.noaux i8042.nomux i8042.dumbkbd swiotlb=noforce " + agent,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := bootArgs(tt.in); got != tt.want {
				t.Errorf("bootArgs(%q) =\n%q, want\n%q", tt.in, got, tt.want)
			}
		})
	}
}

func TestBootLayout(t *testing.T) {
	spec := vmm.Spec{
		RunDir: "/run/vm", Kernel: "/k", Initrd: "/i", Cmdline: "quiet", VCPUs: 2, MemoryMiB: 512,
		Disks: []vmm.Disk{{Path: "/r", ReadOnly: true}, {Path: "/w"}},
		NIC:   &vmm.NIC{TapName: "tap3", MAC: "02:fc:00:00:00:03"},
	}
	got, err := bootLayout(spec, true)
	if err != nil {
		t.Fatalf("bootLayout: %v", err)
	}
	want := Layout{
		VCPUs: 2, MemoryMiB: 512, DirtyTracking: true, BootArgs: bootArgs("quiet"),
		Disks: []DiskLayout{{ID: "d0", Path: "d0", ReadOnly: true}, {ID: "d1", Path: "d1"}},
		NIC:   &NICLayout{ID: "eth0", TapName: "tap3", MAC: "02:fc:00:00:00:03"},
		Vsock: VsockLayout{GuestCID: 3, Path: "vsock.sock", Port: 1024}, Entropy: true,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bootLayout (-want +got):\n%s", diff)
	}
	// Without an initramfs the first disk is the kernel's root device.
	spec.Initrd = ""
	got, _ = bootLayout(spec, false)
	if !got.Disks[0].Root || got.Disks[1].Root {
		t.Errorf("bootLayout without initrd: disks %+v, want d0 as root", got.Disks)
	}
}

func TestNormalize(t *testing.T) {
	got, err := normalize(vmm.Spec{RunDir: "/run/./vm/", Kernel: "/k", MemoryMiB: 128, Disks: []vmm.Disk{{Path: "/d"}}}, true)
	if err != nil {
		t.Fatalf("normalize: %v", err)
	}
	want := vmm.Spec{RunDir: "/run/vm", Kernel: "/k", VCPUs: 1, MemoryMiB: 128, Disks: []vmm.Disk{{Path: "/d"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("normalize (-want +got):\n%s", diff)
	}
	// A restore takes kernel, vcpus and memory from the snapshot.
	if _, err := normalize(vmm.Spec{RunDir: "/run/vm"}, false); err != nil {
		t.Errorf("normalize for restore without kernel and memory: %v", err)
	}
	if _, err := normalize(vmm.Spec{RunDir: "/run/vm"}, true); !errors.Is(err, errkind.InvalidArgument) {
		t.Errorf("normalize for boot without kernel = %v, want invalid argument", err)
	}
}

func TestInstanceID(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)
	dirs := []string{"/run/space/sb_0123", "/run/other/sb_0123", "/run/space/" + strings.Repeat("ü", 10), "/", "/run/space/" + strings.Repeat("a", 200)}
	seen := map[string]string{}
	for _, dir := range dirs {
		id := instanceID(dir)
		if !valid.MatchString(id) {
			t.Errorf("instanceID(%q) = %q, not a valid firecracker/jailer id", dir, id)
		}
		if other, ok := seen[id]; ok {
			t.Errorf("instanceID(%q) = instanceID(%q) = %q", dir, other, id)
		}
		seen[id] = dir
		if again := instanceID(dir); again != id {
			t.Errorf("instanceID(%q) is not stable: %q then %q", dir, id, again)
		}
	}
	if id := instanceID("/run/space/sb_0123"); !strings.HasPrefix(id, "sb-0123-") {
		t.Errorf("instanceID keeps the base name readable: got %q", id)
	}
}

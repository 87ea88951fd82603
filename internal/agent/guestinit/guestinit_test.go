package guestinit

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseCmdline(t *testing.T) {
	defaults := Params{Root: "/dev/vda", RootFS: "ext4", Hostname: "sandbox", Transport: "virtio-serial", Port: "space.agent", VsockPort: 1024}
	tests := []struct {
		name    string
		cmdline string
		want    Params
		wantErr bool
	}{
		{"defaults", "console=ttyS0 quiet", defaults, false},
		{"all keys", "space.root=/dev/vdc space.rw=/dev/vdd space.hostname=box1 space.transport=vsock space.vsock_port=52 space.debug=1",
			Params{Root: "/dev/vdc", RootFS: "ext4", RW: "/dev/vdd", Hostname: "box1", Transport: "vsock", Port: "space.agent", VsockPort: 52, Debug: true}, false},
		{"bad transport", "space.transport=carrier-pigeon", Params{}, true},
		{"bad vsock port", "space.vsock_port=x", Params{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseCmdline(tt.cmdline)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseCmdline(%q) error = %v, want error %v", tt.cmdline, err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseCmdline(%q) differs (-want +got):\n%s", tt.cmdline, diff)
			}
			// Args is the inverse.
			back, err := ParseCmdline(joinArgs(got.Args()))
			if err != nil || !cmp.Equal(back, got) {
				t.Errorf("ParseCmdline(Args()) = %+v, %v; want %+v", back, err, got)
			}
		})
	}
}

func joinArgs(a []string) string {
	s := ""
	for _, x := range a {
		s += x + " "
	}
	return s
}

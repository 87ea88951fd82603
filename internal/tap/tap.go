// Package tap opens TAP devices, in any network namespace, as descriptors a
// VMM can be handed: the VMM then needs neither the namespace nor the
// privilege to create network devices.
package tap

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
	"space/internal/netns"
)

// Open opens the persistent tap device name in the network namespace at
// netnsPath ("" = the caller's) and returns its queue descriptor, set up
// for virtio-net (IFF_TAP, no packet info, virtio-net headers).
func Open(netnsPath, name string) (*os.File, error) {
	if name == "" || len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tap name %q: %w", name, errkind.InvalidArgument)
	}
	var f *os.File
	err := netns.Do(netnsPath, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		var ifr [unix.IFNAMSIZ + 64]byte
		copy(ifr[:], name)
		*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); errno != 0 {
			unix.Close(fd)
			return fmt.Errorf("attach tap %s: %w", name, errno)
		}
		f = os.NewFile(uintptr(fd), "tap:"+name)
		return nil
	})
	return f, err
}

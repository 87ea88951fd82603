// Package tap opens TAP devices, in any network namespace, as descriptors a
// VMM can be handed: the VMM then needs neither the namespace nor the
// privilege to create network devices.
package tap

import (
	"errors"
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
		fd, err := queue(name)
		if err != nil {
			return err
		}
		f = os.NewFile(uintptr(fd), "tap:"+name)
		return nil
	})
	return f, err
}

// queue opens a queue of tap device name in the caller's namespace (the
// device is made if there is none), set up for virtio-net: IFF_TAP, no
// packet info, virtio-net headers.
func queue(name string) (int, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var ifr [unix.IFNAMSIZ + 64]byte
	copy(ifr[:], name)
	*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); errno != 0 {
		unix.Close(fd)
		return -1, fmt.Errorf("attach tap %s: %w", name, errno)
	}
	return fd, nil
}

// Create makes a persistent tap device name in the network namespace at
// netnsPath, owned by uid (-1 = root only), up, without addresses, for a
// VMM that opens it by name (Firecracker) and a gateway that reads its
// host side with a packet socket. IPv6 is turned off in the namespace
// first, so its kernel never gives the tap a link-local address to answer
// the guest from: the namespace's kernel holds no address at all.
func Create(netnsPath, name string, uid int) error {
	if name == "" || len(name) >= unix.IFNAMSIZ {
		return fmt.Errorf("tap name %q: %w", name, errkind.InvalidArgument)
	}
	return netns.Do(netnsPath, func() error {
		for _, knob := range []string{"all", "default"} {
			err := os.WriteFile("/proc/sys/net/ipv6/conf/"+knob+"/disable_ipv6", []byte("1"), 0)
			if err != nil && !errors.Is(err, os.ErrNotExist) { // ENOENT: no IPv6 at all
				return fmt.Errorf("turn IPv6 off: %w", err)
			}
		}
		fd, err := queue(name) // makes the device if it is not there
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if uid >= 0 {
			if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, uid); err != nil {
				return fmt.Errorf("tap %s owner: %w", name, err)
			}
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			return fmt.Errorf("tap %s persist: %w", name, err)
		}
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		req, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, req); err != nil {
			return fmt.Errorf("tap %s flags: %w", name, err)
		}
		req.SetUint16(req.Uint16() | unix.IFF_UP)
		if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, req); err != nil {
			return fmt.Errorf("tap %s up: %w", name, err)
		}
		return nil
	})
}

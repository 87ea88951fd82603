// Package tap opens TAP devices, in any network namespace, as descriptors a
// VMM can be handed: the VMM then needs neither the namespace nor the
// privilege to create network devices.
package tap

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// Open opens the persistent tap device name in the network namespace at
// netnsPath ("" = the caller's) and returns its queue descriptor, set up
// for virtio-net (IFF_TAP, no packet info, virtio-net headers).
func Open(netnsPath, name string) (*os.File, error) {
	if name == "" || len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tap name %q: %w", name, errkind.InvalidArgument)
	}
	var f *os.File
	err := inNetns(netnsPath, func() error {
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

// inNetns runs fn on a thread that has entered the namespace at path and
// switches back afterwards. A thread that cannot switch back stays locked,
// so the runtime retires it with its goroutine (or, were it the main
// thread, parks it) instead of reusing it in the wrong namespace.
func inNetns(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			errc <- fmt.Errorf("current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread() // still in its own namespace
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

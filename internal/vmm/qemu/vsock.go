package qemu

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"space/internal/errkind"
)

// vhostVsockSetGuestCID is VHOST_VSOCK_SET_GUEST_CID, _IOW(0xAF, 0x60, __u64).
const vhostVsockSetGuestCID = 0x4008af60

// agentVsockPort is the vsock port the guest agent listens on.
const agentVsockPort = 1024

// vsockAvailable reports whether this host has vhost-vsock.
func vsockAvailable() bool {
	f, err := os.OpenFile("/dev/vhost-vsock", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// OpenVsock opens /dev/vhost-vsock and claims a free guest CID on it. CIDs
// are global to the host: the kernel refuses one in use, so a random one is
// tried until one is free. QEMU gets the descriptor (vhostfd) and sets the
// same CID again on it, which the kernel allows.
func OpenVsock() (*Vsock, error) {
	for range 16 {
		f, err := os.OpenFile("/dev/vhost-vsock", os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open vhost-vsock: %v: %w", err, errkind.FailedPrecondition)
		}
		var b [4]byte
		rand.Read(b[:])
		cid := uint64(3 + binary.LittleEndian.Uint32(b[:])%0xfffffff0) // 0-2 and -1 are reserved
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), vhostVsockSetGuestCID, uintptr(unsafe.Pointer(&cid)))
		if errno == 0 {
			return &Vsock{CID: uint32(cid), FD: f}, nil
		}
		f.Close()
		if !errors.Is(errno, unix.EADDRINUSE) {
			return nil, fmt.Errorf("set vsock guest cid: %w", errno)
		}
	}
	return nil, fmt.Errorf("no free vsock guest cid after 16 tries: %w", errkind.ResourceExhausted)
}

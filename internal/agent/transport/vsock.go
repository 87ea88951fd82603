package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// VsockListener accepts host connections on a vsock port. Each connection is
// its own session; several may run at once.
type VsockListener struct {
	fd   int
	once sync.Once
}

// ListenVsock listens on port for connections from the host (any CID).
func ListenVsock(port uint32) (*VsockListener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock bind port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("vsock listen port %d: %w", port, err)
	}
	return &VsockListener{fd: fd}, nil
}

// Accept waits for the next host connection or ctx's end (which closes the
// listener).
func (l *VsockListener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		nfd, _, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("vsock accept: %w", err)
		}
		// Non-blocking, so the file is pollable and Close interrupts reads.
		return os.NewFile(uintptr(nfd), "vsock"), nil
	}
}

// Close stops the listener. Shutdown wakes a blocked Accept.
func (l *VsockListener) Close() error {
	var err error
	l.once.Do(func() {
		unix.Shutdown(l.fd, unix.SHUT_RDWR)
		err = unix.Close(l.fd)
	})
	return err
}

// Package netns runs code inside a network namespace without letting the
// namespace leak into the rest of the process.
package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn on a thread that has entered the network namespace at
// path ("" = ours): a process fn starts inherits the namespace. The thread
// returns to its own namespace afterwards; if it cannot, it stays locked
// and the runtime discards it. (Letting a locked goroutine simply exit is
// not enough: on the main thread the runtime parks it instead, which would
// leave the whole process's /proc/self/ns/net in, and pinning, the VM's
// namespace.)
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	ns, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer ns.Close()
	return onThread(path, func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", path, err)
		}
		return nil
	}, fn)
}

// onThread runs enter, then (if it worked) fn, on a locked thread, and
// puts the thread back into the network namespace it had; see Do. what
// names the namespace in errors.
func onThread(what string, enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			// Setns and unshare either switch the thread or leave it.
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave network namespace %s: %w", what, err))
			return // still locked: the thread goes with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Create makes a new, empty network namespace and pins it at path (a
// bind mount, as `ip netns add` makes under /run/netns): it has only a
// loopback device, which is down, and no routes. path must not exist.
func Create(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	f.Close()
	err = onThread(path, func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("new network namespace: %w", err)
		}
		return nil
	}, func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("pin network namespace at %s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// Remove unpins the namespace at path and removes the file; the
// namespace ends once no process or socket is in it any more. A path that
// is gone is no error.
func Remove(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpin network namespace %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Ensure makes sure a namespace is pinned at path: one that is stays (a
// restarted caller finds its sandbox's namespace again), anything else
// there (a file a crash left before the pin) is replaced by a new one.
func Ensure(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err == nil && st.Type == unix.NSFS_MAGIC {
		return nil
	}
	if err := Remove(path); err != nil {
		return err
	}
	return Create(path)
}

// Package netns runs code inside a network namespace without letting the
// namespace leak into the rest of the process.
package netns

import (
	"errors"
	"fmt"
	"os"
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
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave network namespace %s: %w", path, err))
			return // still locked: the thread goes with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

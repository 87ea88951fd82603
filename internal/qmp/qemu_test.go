package qmp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"space/internal/testenv"
)

// proc is a started QEMU; err is set before done is closed.
type proc struct {
	done chan struct{}
	err  error
}

// startQEMU starts a paused, empty q35 machine whose QMP monitor listens on
// a socket bound here, so the caller can dial at once. It returns the socket
// path and the process, which the test kills on cleanup.
func startQEMU(t *testing.T) (string, *proc) {
	t.Helper()
	testenv.RequireQEMU(t)
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	l.SetUnlinkOnClose(false)
	lf, err := l.File()
	l.Close()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer lf.Close()

	var stderr bytes.Buffer
	cmd := exec.Command("qemu-system-x86_64",
		"-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-M", "q35", "-accel", "tcg",
		"-chardev", "socket,id=qmp,fd=3,server=on,wait=off",
		"-mon", "chardev=qmp,mode=control")
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("setup: start qemu: %v", err)
	}
	p := &proc{done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("qemu stderr:\n%s", stderr.String())
		}
	})
	return path, p
}

func TestRealQEMU(t *testing.T) {
	path, p := startQEMU(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	start := time.Now()
	c, err := Dial(ctx, path, WithEventBuffer(16))
	if err != nil {
		t.Fatalf("Dial() = %v", err)
	}
	defer c.Close()
	t.Logf("qemu %s (%s) ready for QMP %v after dial", c.Version(), c.Version().Package, time.Since(start))
	if c.Version().Major < 7 {
		t.Errorf("Version() = %v, want at least 7.x", c.Version())
	}

	status := func() string {
		t.Helper()
		var st struct {
			Status string `json:"status"`
		}
		if err := c.Execute(ctx, "query-status", nil, &st); err != nil {
			t.Fatalf("Execute(query-status) = %v", err)
		}
		return st.Status
	}
	waitEvent := func(name string) {
		t.Helper()
		for {
			select {
			case ev, ok := <-c.Events():
				if !ok {
					t.Fatalf("Events() closed while waiting for %s", name)
				}
				if ev.Name == name {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no %s event: %v", name, ctx.Err())
			}
		}
	}

	if got := status(); got != "prelaunch" {
		t.Errorf("status at start = %q, want prelaunch", got)
	}
	if err := c.Execute(ctx, "cont", nil, nil); err != nil {
		t.Fatalf("Execute(cont) = %v", err)
	}
	waitEvent("RESUME")
	if got := status(); got != "running" {
		t.Errorf("status after cont = %q, want running", got)
	}
	if err := c.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatalf("Execute(stop) = %v", err)
	}
	waitEvent("STOP")
	if got := status(); got != "paused" {
		t.Errorf("status after stop = %q, want paused", got)
	}

	// Unknown commands and bad fd names come back as typed errors.
	var qerr *Error
	if err := c.Execute(ctx, "no-such-command", nil, nil); !errors.As(err, &qerr) || qerr.Class != "CommandNotFound" {
		t.Errorf("Execute(no-such-command) = %v, want *Error of class CommandNotFound", err)
	}
	if err := c.Execute(ctx, "closefd", map[string]string{"fdname": "nope"}, nil); !errors.As(err, &qerr) || qerr.Class != "GenericError" {
		t.Errorf("Execute(closefd nope) = %v, want *Error of class GenericError", err)
	}

	// A descriptor passed with getfd can be closed again by name.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	defer pr.Close()
	defer pw.Close()
	if err := c.SendFile(ctx, "state", pw); err != nil {
		t.Fatalf("SendFile(state) = %v", err)
	}
	if err := c.Execute(ctx, "closefd", map[string]string{"fdname": "state"}, nil); err != nil {
		t.Errorf("Execute(closefd state) = %v", err)
	}

	if err := c.Execute(ctx, "quit", nil, nil); err != nil && !errors.Is(err, ErrDisconnected) {
		t.Fatalf("Execute(quit) = %v", err)
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("connection still open after quit")
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("qemu exit after quit = %v, want success", p.err)
		}
	case <-ctx.Done():
		t.Fatal("qemu still running after quit")
	}
}

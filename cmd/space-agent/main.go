// Command space-agent is the guest's PID 1: it prepares the sandbox root and
// serves the host's exec, pty and file calls over virtio-serial or vsock.
//
// It never exits on its own: while no host is attached it waits, and it
// ends only by powering the guest off on the host's request.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/guestinit"
	"space/internal/agent/guestsys"
	"space/internal/agent/ring"
	"space/internal/agent/server"
	"space/internal/agent/transport"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "space-agent: must run as PID 1 inside a SPACE guest")
		os.Exit(2)
	}
	level := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "agent")
	err := run(log, level)
	// PID 1 must not exit: the kernel would panic. Report, then keep the
	// console readable and power off.
	log.Error("agent failed", "err", err)
	time.Sleep(time.Second)
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

func run(log *slog.Logger, level *slog.LevelVar) error {
	start := time.Now()
	in := guestinit.New(log)
	if err := in.EarlyMounts(); err != nil {
		return err
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	p, err := guestinit.ParseCmdline(string(cmdline))
	if err != nil {
		return err
	}
	if p.Debug {
		level.Set(slog.LevelDebug)
	}
	if err := in.LoadModules(); err != nil {
		log.Warn("some modules did not load", "err", err) // a missing driver fails below, with its name
	}
	if err := in.MountRoot(p); err != nil {
		return err
	}
	if err := in.SwitchRoot(); err != nil {
		return err
	}
	if err := in.Identity(p); err != nil {
		return err
	}
	var l server.Listener
	switch p.Transport {
	case "vsock":
		vl, err := transport.ListenVsock(p.VsockPort)
		if err != nil {
			return err
		}
		l = vl
	default:
		dev, err := waitPort(p.Port, 10*time.Second)
		if err != nil {
			return err
		}
		port, err := transport.OpenVirtioPort(dev)
		if err != nil {
			return err
		}
		l = port
	}
	// A ring in the guest's RAM carries bulk bytes where the host can map
	// that RAM; without it everything moves over the connection.
	var rg *ring.Region
	mem, chunks, err := ring.AllocGuest(ring.DefaultSize)
	if err == nil {
		rg, err = ring.New(mem, ring.Guest)
	}
	var pages server.Pinner
	if err != nil {
		log.Warn("no ring for bulk bytes", "err", err)
	} else if fp, err := ring.OpenFilePages(); err != nil {
		log.Warn("file reads are copied into the ring", "err", err)
	} else {
		pages = fp
	}
	srv, err := server.New(server.Config{
		Version:    version,
		Log:        log,
		ReapAll:    true,
		System:     guestsys.New(log, guestinit.SyncDisks),
		Ring:       rg,
		RingChunks: chunks,
		Pages:      pages,
	})
	if err != nil {
		return err
	}
	log.Info("agent ready", "transport", p.Transport, "init_ms", time.Since(start).Milliseconds(), "version", version)
	return srv.Run(context.Background(), l)
}

// waitPort waits for the virtio-serial port to show up in sysfs: the
// driver registers ports asynchronously after the module loads.
func waitPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		dev, err := transport.FindVirtioPort(name)
		if err == nil {
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

package fake

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"space/internal/agent/proto"
	"space/internal/agent/server"
)

// childName is the name a fake guest runs under: init recognizes it.
const childName = "space-fakevm"

// init turns this process into a fake guest when the jail exec'd it under
// childName: it never returns then. Any binary that links this package
// can thus be a fake guest, test binaries included.
func init() {
	if filepath.Base(os.Args[0]) != childName {
		return
	}
	os.Exit(guestMain(os.Args[1:]))
}

// guestMain serves the agent on the listener inherited as fd 3, as PID 1
// of the guest's namespace, until SIGTERM or a power-off request.
func guestMain(args []string) int {
	fs := flag.NewFlagSet(childName, flag.ContinueOnError)
	silent := fs.Bool("agent-silent", false, "accept agent connections and never answer (fault point agent)")
	exitNow := fs.Bool("exit-after-boot", false, "exit at once (fault point exit-after-boot)")
	nic := fs.Bool("nic", false, "take NIC backend connections on fd 4 and drop their frames")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", childName)
	if *exitNow {
		log.Error("exiting right after boot (injected fault exit-after-boot)")
		return 1
	}
	f := os.NewFile(3, "agent.sock")
	ln, err := net.FileListener(f)
	f.Close()
	if err != nil {
		log.Error("agent listener", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	if *nic {
		nf := os.NewFile(4, "net.sock")
		nln, err := net.FileListener(nf)
		nf.Close()
		if err != nil {
			log.Error("nic listener", "err", err)
			return 1
		}
		go dropFrames(ctx, nln) // ends with the process
	}
	if *silent {
		log.Warn("agent silent (injected fault agent)")
		silence(ctx, ln)
		return 0
	}
	srv, err := server.New(server.Config{
		Version: "fake-" + Version, Log: log, ReapAll: true, System: system{},
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8", "TMPDIR=/tmp"},
	})
	if err != nil {
		log.Error("agent", "err", err)
		return 1
	}
	if err := srv.Run(ctx, listener{ln}); err != nil {
		log.Error("agent", "err", err)
		return 1
	}
	return 0
}

// silence accepts connections and holds them, unanswered, until ctx ends.
func silence(ctx context.Context, ln net.Listener) {
	context.AfterFunc(ctx, func() { ln.Close() })
	var held []net.Conn
	for {
		c, err := ln.Accept()
		if err != nil {
			for _, c := range held {
				c.Close()
			}
			return
		}
		held = append(held, c)
	}
}

// dropFrames takes NIC backend connections (one at a time, as a NIC
// would) and discards what they send: the guest has no network.
func dropFrames(ctx context.Context, ln net.Listener) {
	context.AfterFunc(ctx, func() { ln.Close() })
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c)
		c.Close()
	}
}

// listener adapts a net.Listener to server.Listener.
type listener struct{ ln net.Listener }

func (l listener) Accept(ctx context.Context) (io.ReadWriteCloser, error) {
	stop := context.AfterFunc(ctx, func() { l.ln.Close() })
	defer stop()
	c, err := l.ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("accept: %w", err)
	}
	return c, nil
}

var _ server.Identifier = system{}

// system is the fake guest's server.System. A jailed process may not set
// the host's clock, entropy pool or hostname (the jail set "jail"), and
// has no network to configure: those requests succeed and change nothing.
type system struct{}

func (system) SetClock(time.Time) error { return nil }

func (system) AddEntropy([]byte) error { return nil }

func (system) SetHostname(string) error { return nil }

func (system) ConfigureNetwork(context.Context, proto.NetConfig) error { return nil }

// SetMachineID and SetBootID change nothing either: the files are the
// host's. BootID is the host's.
func (system) SetMachineID(string) error { return nil }

func (system) SetBootID(string) error { return nil }

func (system) BootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b)), err
}

// PowerOff ends the guest: PID 1's exit ends every process of its
// namespace.
func (system) PowerOff(bool) error {
	os.Exit(0)
	return nil
}

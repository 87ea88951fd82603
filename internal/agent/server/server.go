// Package server is the guest side of the agent protocol: it serves exec,
// pty, file, port-probe and system calls from the host over one multiplexed
// connection.
//
// It runs inside space-agent (PID 1 of the guest) and, in tests, as an
// ordinary process on the host. Everything that touches the guest as a whole
// (the clock, the RNG, the network, power) goes through the System it is
// given, so tests can run it without changing the host.
//
// Processes live in a table (procTable) rather than in the calls that
// started them: op exec, proc.start and proc.attach attach a stream to a
// process, and a process may outlive its stream and the host connection.
// Each process's output goes through a bounded log (outputLog) that an
// attachment drains; see docs/agent-protocol.md for the semantics.
//
// Lock order: Server.mu, then reaper.mu; process.mu, then outputLog.mu.
// procTable.mu and attachment.mu are taken alone. None is held across I/O.
package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"space/internal/agent/proto"
	"space/internal/agent/ring"
	"space/internal/errkind"
)

// System is what the agent changes about the guest as a whole.
type System interface {
	SetClock(t time.Time) error
	AddEntropy(seed []byte) error
	SetHostname(name string) error
	ConfigureNetwork(ctx context.Context, cfg proto.NetConfig) error
	// PowerOff stops every process and powers the guest off (or reboots
	// it). It is called after the reply to the host was sent.
	PowerOff(reboot bool) error
}

// Identifier is a System that can give the guest a machine identity of
// its own (proto.PostRestore's MachineID and BootID). A System without it
// refuses them with FailedPrecondition.
type Identifier interface {
	// SetMachineID replaces the guest's machine-id files with id.
	SetMachineID(id string) error
	// SetBootID makes every process, those running and those started
	// later, read id from /proc/sys/kernel/random/boot_id.
	SetBootID(id string) error
	// BootID is the boot_id the guest's processes read now.
	BootID() (string, error)
}

// Reclaimer is a System that can give the guest's cached memory back to
// the host (proto.OpMemoryReclaim).
type Reclaimer interface {
	ReclaimMemory() (proto.Reclaimed, error)
}

// Config configures a Server.
type Config struct {
	// Version is reported in the handshake and in health replies.
	// "" = "dev".
	Version string
	// Log receives the agent's own events. nil = discard.
	Log *slog.Logger
	// ReapAll makes the server reap every child process (it is PID 1).
	// Otherwise it waits only for the processes it started.
	ReapAll bool
	// Env is the environment execs start from. nil = a minimal PATH/HOME.
	Env []string
	// System applies clock, entropy, network and power requests. nil =
	// those ops return FailedPrecondition.
	System System
	// ExitGrace is how long an exec keeps reading output after its process
	// exited, while background children hold the pipes open and stay
	// silent. 0 = 200ms.
	ExitGrace time.Duration
	// Ring is the guest's side of a region of its RAM that the host maps
	// for bulk bytes (ring.AllocGuest), or nil for none: everything then
	// goes inline on the connection. RingChunks are its guest-physical
	// addresses.
	Ring       *ring.Region
	RingChunks []uint64
	// Pages pins files' page cache so that the host copies file reads
	// from guest memory in place (ring.FilePages), or nil: reads are
	// copied into the ring. It is offered only with a Ring.
	Pages Pinner
	// WatchQueue is how many events a file watch holds while its host
	// reads too slowly, before it drops them and reports an overflow.
	// 0 = proto.WatchQueue.
	WatchQueue int
}

// Server serves agent connections. Create it with New; Close stops it.
type Server struct {
	cfg     Config
	log     *slog.Logger
	start   time.Time
	reaper  *reaper
	procs   *procTable
	runDone chan struct{} // closed when Run returns
	appends pathLocks     // in-place writes under way, by path
	names   names         // user and group names of IDs

	mu sync.Mutex
	// +checklocks:mu
	sessions map[*yamux.Session]io.Writer // to the connection it runs on
	// +checklocks:mu
	closed bool
	wg     sync.WaitGroup // one per running session and stream
}

// New validates cfg and returns a Server. It starts no goroutines; call Run.
func New(cfg Config) (*Server, error) {
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Env == nil {
		cfg.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"}
	}
	if cfg.ExitGrace == 0 {
		cfg.ExitGrace = 200 * time.Millisecond
	}
	if cfg.WatchQueue <= 0 {
		cfg.WatchQueue = proto.WatchQueue
	}
	return &Server{
		cfg:      cfg,
		log:      cfg.Log,
		start:    time.Now(),
		reaper:   newReaper(cfg.ReapAll),
		procs:    newProcTable(cfg.Log, cfg.ExitGrace),
		runDone:  make(chan struct{}),
		sessions: map[*yamux.Session]io.Writer{},
	}, nil
}

// Listener yields host connections: a virtio-serial port each time a host
// connects to it, or accepted vsock connections.
type Listener interface {
	Accept(ctx context.Context) (io.ReadWriteCloser, error)
}

// Run serves connections from l until ctx ends, then closes every session,
// kills every process of the table and waits for its streams and processes.
func (s *Server) Run(ctx context.Context, l Listener) error {
	defer close(s.runDone)
	reapCtx, stopReap := context.WithCancel(ctx)
	reapDone := make(chan struct{})
	go func() { defer close(reapDone); s.reaper.run(reapCtx) }()
	defer func() { stopReap(); <-reapDone }()
	defer s.procs.wait() // the reaper still runs: the killed processes are reaped
	defer s.wg.Wait()
	defer s.Close()
	for {
		conn, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept host connection: %w", err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.ServeConn(ctx, conn); err != nil && ctx.Err() == nil {
				s.log.Info("host session ended", "err", err)
			}
		}()
	}
}

// Close ends every session and kills every running process of the table.
// It is idempotent.
func (s *Server) Close() error {
	s.procs.close()
	s.mu.Lock()
	s.closed = true
	sessions := make([]*yamux.Session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	for _, sess := range sessions {
		sess.Close()
	}
	return nil
}

// flusher is a connection that buffers writes (transport.VirtioPort's).
type flusher interface{ Flush() error }

// flush waits until what every session wrote is on its connection.
func (s *Server) flush() {
	s.mu.Lock()
	var fs []flusher
	for _, w := range s.sessions {
		if f, ok := w.(flusher); ok {
			fs = append(fs, f)
		}
	}
	s.mu.Unlock()
	for _, f := range fs {
		f.Flush()
	}
}

// ServeConn runs the handshake and one session on conn and returns when the
// host goes away. conn is closed on return.
func (s *Server) ServeConn(ctx context.Context, conn io.ReadWriteCloser) error {
	defer conn.Close()
	br := bufio.NewReaderSize(conn, 4096)
	hello, err := proto.ReadHello(br, 0)
	if err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	if hello.Version != proto.Version {
		s.log.Warn("host speaks another protocol version", "host_version", hello.Version)
	}
	for {
		ready := proto.Ready{Version: proto.Version, Nonce: hello.Nonce, AgentVersion: s.cfg.Version}
		if _, err := conn.Write(ready.Line()); err != nil {
			return fmt.Errorf("handshake: %w", err)
		}
		next, err := proto.ReadStart(br, hello)
		if err != nil {
			return fmt.Errorf("handshake: %w", err)
		}
		if next == nil {
			break
		}
		hello = *next
	}
	sess, err := yamux.Server(proto.Buffered(br, conn), proto.YamuxConfig())
	if err != nil {
		return fmt.Errorf("start session: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sess.Close()
		return errors.New("server closed")
	}
	s.sessions[sess] = conn
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.sessions, sess)
		s.mu.Unlock()
		sess.Close()
	}()
	s.log.Info("host connected")
	ss := &session{}
	var streams sync.WaitGroup
	defer streams.Wait()
	// Before the wait: a stream waiting for a ring slot gives up once the
	// ring session ended, and a slot being filled stays its writer's.
	defer ss.end()
	for {
		st, err := sess.AcceptStreamWithContext(ctx)
		if err != nil {
			return err
		}
		streams.Add(1)
		go func() {
			defer streams.Done()
			s.handle(ctx, ss, st)
		}()
	}
}

// stream is what a call runs on: a yamux stream.
type stream interface {
	io.ReadWriteCloser
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
}

// call is one stream: a request and its reply frames.
type call struct {
	st   stream
	sess *session
	r    *proto.Reader
	mu   sync.Mutex // serializes frames on st
}

func (c *call) send(t proto.Type, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return proto.WriteFrame(c.st, t, payload)
}

func (c *call) sendJSON(t proto.Type, v any) error {
	p, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", t, err)
	}
	return c.send(t, p)
}

func (c *call) fail(err error) error {
	return c.sendJSON(proto.TypeError, proto.ErrorFrom(err))
}

func (c *call) result(v any) error { return c.sendJSON(proto.TypeResult, v) }

func (s *Server) handle(ctx context.Context, ss *session, st *yamux.Stream) {
	defer st.Close()
	c := &call{st: st, sess: ss, r: proto.NewReader(st, 0)}
	f, err := c.r.Next()
	if err != nil {
		if !errors.Is(err, io.EOF) {
			c.fail(fmt.Errorf("read request: %w", err))
		}
		return
	}
	var req proto.Request
	if f.Type != proto.TypeRequest {
		c.fail(fmt.Errorf("first frame is %s, want request: %w", f.Type, errkind.InvalidArgument))
		return
	}
	// Requests may pass MaxControl: a write's extended attributes.
	if err := proto.DecodeJSON(f, proto.MaxFrame, &req); err != nil {
		c.fail(err)
		return
	}
	if err := s.dispatch(ctx, c, req); err != nil {
		s.log.Debug("call failed", "op", req.Op, "err", err)
	}
}

func (s *Server) dispatch(ctx context.Context, c *call, req proto.Request) error {
	switch req.Op {
	case proto.OpHealth:
		return c.result(s.health())
	case proto.OpExec:
		var a proto.ExecRequest
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.exec(ctx, c, a)
	case proto.OpProcStart:
		var a proto.ProcStart
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.procStart(ctx, c, a)
	case proto.OpProcAttach:
		var a proto.ProcRef
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.procAttach(ctx, c, a)
	case proto.OpProcList:
		var a proto.Empty
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.procList(c)
	case proto.OpProcSignal:
		var a proto.ProcSignal
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return reply(c, proto.Empty{}, s.procSignal(a))
	case proto.OpProcInput:
		var a proto.ProcInput
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return reply(c, proto.Empty{}, s.procInput(a))
	case proto.OpMemoryReclaim:
		var a proto.Empty
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		r, ok := s.cfg.System.(Reclaimer)
		if !ok {
			return c.fail(fmt.Errorf("memory.reclaim: %w", errNoSystem))
		}
		got, err := r.ReclaimMemory()
		return reply(c, got, err)
	case proto.OpFileRead:
		var a proto.ReadArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.readFile(ctx, c, a)
	case proto.OpFileWrite:
		var a proto.WriteArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.refuse(err)
		}
		return s.writeFile(c, a)
	case proto.OpTarRead:
		var a proto.PathArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.tarRead(ctx, c, a)
	case proto.OpTarWrite:
		var a proto.TarWriteArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.refuse(err)
		}
		return s.tarWrite(ctx, c, a)
	case proto.OpFileStat:
		var a proto.PathArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		if p, err := guestPath(a.Path); err == nil && a.Settle {
			s.appends.lock(p)()
		}
		info, err := s.statFile(a)
		return reply(c, info, err)
	case proto.OpFileList:
		var a proto.ListArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.listDir(c, a)
	case proto.OpFileMkdir:
		var a proto.MkdirArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return reply(c, proto.Empty{}, mkdir(a))
	case proto.OpFileRemove:
		var a proto.RemoveArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return reply(c, proto.Empty{}, remove(a))
	case proto.OpFileRename:
		var a proto.RenameArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return reply(c, proto.Empty{}, rename(a))
	case proto.OpPostRestore:
		var a proto.PostRestore
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return reply(c, proto.Empty{}, s.postRestore(ctx, a))
	case proto.OpNetwork:
		var a proto.NetConfig
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return reply(c, proto.Empty{}, s.network(ctx, a))
	case proto.OpShutdown:
		var a proto.Shutdown
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.shutdown(c, a)
	case proto.OpRing:
		var a proto.Empty
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.ringAttach(c)
	case proto.OpFileWatch:
		var a proto.WatchArgs
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		return s.watch(c, a)
	case proto.OpPortProbe:
		var a proto.PortProbe
		if err := decodeArgs(req, &a); err != nil {
			return c.fail(err)
		}
		st, err := probePort(ctx, a)
		return reply(c, st, err)
	default:
		return c.fail(fmt.Errorf("unknown op %.64q: %w", req.Op, errkind.InvalidArgument))
	}
}

// reply sends v, or err when it is not nil.
func reply(c *call, v any, err error) error {
	if err != nil {
		return c.fail(err)
	}
	return c.result(v)
}

func decodeArgs(req proto.Request, v any) error {
	args := req.Args
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	return proto.DecodeJSON(proto.Frame{Type: proto.TypeRequest, Payload: args}, proto.MaxFrame, v)
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

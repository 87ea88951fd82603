package agenttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"space/internal/agent/client"
	"space/internal/agent/proto"
	"space/internal/errkind"
	"space/internal/testenv"
)

// runProc runs the process table scenarios (ops proc.*).
func runProc(t *testing.T, c *client.Client, opts Options) {
	t.Run("ProcTakeoverAndStdin", func(t *testing.T) { testProcTakeover(t, c) })
	t.Run("ProcSharedAttach", func(t *testing.T) { testProcShared(t, c) })
	t.Run("ProcDropsOldestWhileDetached", func(t *testing.T) { testProcDropOldest(t, c) })
	t.Run("ProcList", func(t *testing.T) { testProcList(t, c) })
	t.Run("ProcTag", func(t *testing.T) { testProcTag(t, c) })
	t.Run("ProcUnlisted", func(t *testing.T) { testProcUnlisted(t, c) })
	t.Run("ProcSignal", func(t *testing.T) { testProcSignal(t, c) })
	t.Run("ProcKillOnDetach", func(t *testing.T) { testProcKillOnDetach(t, c) })
	t.Run("ProcTimeoutDetached", func(t *testing.T) { testProcTimeout(t, c) })
	t.Run("ProcPTY", func(t *testing.T) { testProcPTY(t, c) })
	t.Run("ProcErrors", func(t *testing.T) { testProcErrors(t, c) })
}

// proc returns the table entry for id, failing t if there is none.
func proc(t testing.TB, c *client.Client, id int64) proto.ProcInfo {
	t.Helper()
	ps, err := c.Processes(ctx(t, time.Minute))
	if err != nil {
		t.Fatalf("Processes() = %v", err)
	}
	for _, p := range ps {
		if p.ID == id {
			return p
		}
	}
	t.Fatalf("Processes() has no process %d", id)
	return proto.ProcInfo{}
}

// waitProc waits until the table entry for id satisfies cond and returns it.
func waitProc(t testing.TB, c *client.Client, id int64, cond func(proto.ProcInfo) bool) proto.ProcInfo {
	t.Helper()
	var info proto.ProcInfo
	testenv.Eventually(t, 30*time.Second, func() bool {
		info = proc(t, c, id)
		return cond(info)
	})
	return info
}

func exited(p proto.ProcInfo) bool { return !p.Running }

// testProcTakeover: a second attachment takes over from the first, which
// ends with a failed-precondition detach; stdin flows through whichever
// attachment is current, and output goes to it alone.
func testProcTakeover(t *testing.T, c *client.Client) {
	var out1, out2 lockedBuffer
	p1, info, err := c.StartAttached(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"cat"}, Stdin: true}},
		client.IO{Stdout: &out1})
	if err != nil {
		t.Fatalf("StartAttached(cat) = %v", err)
	}
	if !info.Running || !info.Attached || info.ID <= 0 || info.PID != p1.PID || p1.ID != info.ID {
		t.Errorf("StartAttached(cat) info = %+v, process ID %d PID %d; want running, attached, same ids", info, p1.ID, p1.PID)
	}
	if err := p1.WriteStdin([]byte("one\n")); err != nil {
		t.Fatalf("WriteStdin(one) = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return out1.String() == "one\n" })

	p2, info2, err := c.Attach(ctx(t, time.Minute), info.ID, client.IO{Stdout: &out2})
	if err != nil {
		t.Fatalf("Attach(%d) = %v", info.ID, err)
	}
	if !info2.Attached || !info2.Running {
		t.Errorf("Attach(%d) info = %+v, want running and attached", info.ID, info2)
	}
	if _, err := p1.Wait(); !errors.Is(err, client.ErrDetached) || !errors.Is(err, errkind.FailedPrecondition) {
		t.Errorf("first attachment Wait() after takeover = %v, want ErrDetached and FailedPrecondition", err)
	}
	if err := p2.WriteStdin([]byte("two\n")); err != nil {
		t.Fatalf("WriteStdin(two) = %v", err)
	}
	if err := p2.CloseStdin(); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	exit, err := p2.Wait()
	if err != nil || exit != (proto.Exit{}) {
		t.Fatalf("second attachment Wait() = %+v, %v; want exit 0", exit, err)
	}
	if got1, got2 := out1.String(), out2.String(); got1 != "one\n" || got2 != "two\n" {
		t.Errorf("outputs = %q, %q; want %q, %q", got1, got2, "one\n", "two\n")
	}
}

// testProcShared: a shared attachment follows a process alongside its
// attachment without taking over: both get the output written after it
// joined, both reach stdin, and ending the shared one neither detaches nor
// kills the process (started with KillOnDetach).
func testProcShared(t *testing.T, c *client.Client) {
	var out1, out2, out3 lockedBuffer
	p1, info, err := c.StartAttached(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"cat"}, Stdin: true}, KillOnDetach: true},
		client.IO{Stdout: &out1})
	if err != nil {
		t.Fatalf("StartAttached(cat) = %v", err)
	}
	if err := p1.WriteStdin([]byte("one\n")); err != nil {
		t.Fatalf("WriteStdin(one) = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return out1.String() == "one\n" })

	p2, info2, err := c.AttachShared(ctx(t, time.Minute), info.ID, client.IO{Stdout: &out2})
	if err != nil {
		t.Fatalf("AttachShared(%d) = %v", info.ID, err)
	}
	if !info2.Attached || !info2.Running || info2.PID != info.PID {
		t.Errorf("AttachShared(%d) info = %+v, want running and attached", info.ID, info2)
	}
	if err := p1.WriteStdin([]byte("two\n")); err != nil {
		t.Fatalf("WriteStdin(two) through the attachment = %v", err)
	}
	// Two streams' stdin frames are not ordered with each other: wait.
	testenv.Eventually(t, 30*time.Second, func() bool { return out2.String() == "two\n" })
	if err := p2.WriteStdin([]byte("three\n")); err != nil {
		t.Fatalf("WriteStdin(three) through the shared attachment = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		return out1.String() == "one\ntwo\nthree\n" && out2.String() == "two\nthree\n"
	})

	p2.Detach()
	if _, err := p2.Wait(); !errors.Is(err, client.ErrDetached) {
		t.Errorf("shared attachment Wait() after Detach = %v, want ErrDetached", err)
	}
	if err := p1.WriteStdin([]byte("four\n")); err != nil {
		t.Fatalf("WriteStdin(four) after the shared attachment left = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return out1.String() == "one\ntwo\nthree\nfour\n" })
	if got := proc(t, c, info.ID); !got.Running || !got.Attached {
		t.Errorf("after the shared attachment left: %+v, want running and still attached", got)
	}

	p3, _, err := c.AttachShared(ctx(t, time.Minute), info.ID, client.IO{Stdout: &out3})
	if err != nil {
		t.Fatalf("second AttachShared(%d) = %v", info.ID, err)
	}
	if err := p1.CloseStdin(); err != nil {
		t.Fatalf("CloseStdin = %v", err)
	}
	for i, p := range []*client.Process{p1, p3} {
		if exit, err := p.Wait(); err != nil || exit != (proto.Exit{}) {
			t.Errorf("attachment %d Wait() = %+v, %v; want exit 0", i+1, exit, err)
		}
	}
	if out3.String() != "" {
		t.Errorf("late shared attachment got %q, want nothing (it joined after the last output)", out3.String())
	}

	// With no live attachment, a shared attach attaches: it gets the
	// buffered output.
	done, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Shell: "echo left"}})
	if err != nil {
		t.Fatalf("StartProcess(echo) = %v", err)
	}
	waitProc(t, c, done.ID, exited)
	var out bytes.Buffer
	p, _, err := c.AttachShared(ctx(t, time.Minute), done.ID, client.IO{Stdout: &out})
	if err != nil {
		t.Fatalf("AttachShared(%d) with no attachment = %v", done.ID, err)
	}
	if exit, err := p.Wait(); err != nil || exit != (proto.Exit{}) || out.String() != "left\n" {
		t.Errorf("AttachShared to an unattached exited process: Wait() = %+v, %v, output %q; want exit 0 and %q", exit, err, out.String(), "left\n")
	}
}

// testProcTag: a tag is kept with the process and listed; a bad tag is
// refused before anything starts.
func testProcTag(t *testing.T, c *client.Client) {
	tag := "web server ✓"
	p, info, err := c.StartAttached(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Shell: "echo tagged"}, Tag: tag}, client.IO{Stdout: io.Discard})
	if err != nil {
		t.Fatalf("StartAttached(tag %q) = %v", tag, err)
	}
	if info.Tag != tag {
		t.Errorf("StartAttached info tag = %q, want %q", info.Tag, tag)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatalf("Wait() = %v", err)
	}
	if got := proc(t, c, info.ID); got.Tag != tag {
		t.Errorf("listed tag = %q, want %q", got.Tag, tag)
	}
	started, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Shell: "true"}, Tag: "detached"})
	if err != nil || started.Tag != "detached" {
		t.Errorf("StartProcess(tag detached) = %+v, %v", started, err)
	}
	for _, bad := range []string{strings.Repeat("x", proto.MaxProcTag+1), "a\nb", "\xff"} {
		_, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Shell: "touch /tmp/should-not-exist"}, Tag: bad})
		if !errors.Is(err, errkind.InvalidArgument) {
			t.Errorf("StartProcess(tag %.20q) = %v, want invalid argument", bad, err)
		}
	}
}

// seqOutput is what seq 1 n prints.
func seqOutput(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// testProcDropOldest: a detached process writes more than the buffer
// holds; it is never blocked, the oldest output is dropped and counted, and
// an attachment gets exactly the newest ProcOutputLimit bytes, once.
func testProcDropOldest(t *testing.T, c *client.Client) {
	const n = 400000 // about 2.6 MiB of output
	want := seqOutput(n)
	info, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"seq", "1", strconv.Itoa(n)}}})
	if err != nil {
		t.Fatalf("StartProcess(seq) = %v", err)
	}
	if info.Attached {
		t.Errorf("StartProcess info = %+v, want not attached", info)
	}
	waitProc(t, c, info.ID, exited)
	var out bytes.Buffer
	p, got, err := c.Attach(ctx(t, time.Minute), info.ID, client.IO{Stdout: &out})
	if err != nil {
		t.Fatalf("Attach(%d) = %v", info.ID, err)
	}
	exit, err := p.Wait()
	if err != nil || exit != (proto.Exit{}) {
		t.Fatalf("Wait() = %+v, %v; want exit 0", exit, err)
	}
	wantInfo := proto.ProcInfo{Running: false, Exit: &proto.Exit{}, Attached: true,
		BufferedBytes: proto.ProcOutputLimit, DroppedBytes: int64(len(want) - proto.ProcOutputLimit)}
	gotInfo := proto.ProcInfo{Running: got.Running, Exit: got.Exit, Attached: got.Attached, BufferedBytes: got.BufferedBytes, DroppedBytes: got.DroppedBytes}
	if diff := cmp.Diff(wantInfo, gotInfo); diff != "" {
		t.Errorf("Attach(%d) info differs (-want +got):\n%s", info.ID, diff)
	}
	if tail := want[len(want)-proto.ProcOutputLimit:]; !bytes.Equal(out.Bytes(), tail) {
		t.Errorf("output after attach: %d bytes, want the last %d bytes of seq's %d, byte-exact", out.Len(), len(tail), len(want))
	}
	// Delivered once: a second attachment gets the exit and no output.
	out.Reset()
	p, got, err = c.Attach(ctx(t, time.Minute), info.ID, client.IO{Stdout: &out})
	if err != nil {
		t.Fatalf("second Attach(%d) = %v", info.ID, err)
	}
	if exit, err := p.Wait(); err != nil || exit != (proto.Exit{}) || out.Len() != 0 || got.BufferedBytes != 0 {
		t.Errorf("second attach: Wait() = %+v, %v, %d bytes of output, buffered %d; want exit 0 and nothing", exit, err, out.Len(), got.BufferedBytes)
	}
}

func testProcList(t *testing.T, c *client.Client) {
	done, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Shell: "exit 7", Cwd: "/tmp"}})
	if err != nil {
		t.Fatalf("StartProcess(exit 7) = %v", err)
	}
	running, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"sleep", "60"}}})
	if err != nil {
		t.Fatalf("StartProcess(sleep 60) = %v", err)
	}
	defer c.SignalProcess(ctx(t, time.Minute), running.ID, 9)
	if running.ID <= done.ID {
		t.Errorf("ids %d then %d, want increasing", done.ID, running.ID)
	}
	waitProc(t, c, done.ID, exited)
	ps, err := c.Processes(ctx(t, time.Minute))
	if err != nil {
		t.Fatalf("Processes() = %v", err)
	}
	got := map[int64]proto.ProcInfo{}
	for i, p := range ps {
		if i > 0 && p.ID <= ps[i-1].ID {
			t.Errorf("Processes() not ordered by id: %d after %d", p.ID, ps[i-1].ID)
		}
		got[p.ID] = p
	}
	ignore := func(p proto.ProcInfo) proto.ProcInfo { p.StartedUnixMS = 0; return p }
	wantDone := proto.ProcInfo{ID: done.ID, PID: done.PID, Shell: "exit 7", Cwd: "/tmp", Exit: &proto.Exit{Code: 7}}
	if diff := cmp.Diff(wantDone, ignore(got[done.ID])); diff != "" {
		t.Errorf("exited entry differs (-want +got):\n%s", diff)
	}
	wantRunning := proto.ProcInfo{ID: running.ID, PID: running.PID, Argv: []string{"sleep", "60"}, Cwd: "/", Running: true}
	if diff := cmp.Diff(wantRunning, ignore(got[running.ID])); diff != "" {
		t.Errorf("running entry differs (-want +got):\n%s", diff)
	}
	if now := time.Now().UnixMilli(); got[running.ID].StartedUnixMS <= 0 || got[running.ID].StartedUnixMS > now+60_000 {
		t.Errorf("started_unix_ms = %d, want about %d", got[running.ID].StartedUnixMS, now)
	}
}

func testProcSignal(t *testing.T, c *client.Client) {
	info, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"sleep", "60"}}})
	if err != nil {
		t.Fatalf("StartProcess(sleep 60) = %v", err)
	}
	if err := c.SignalProcess(ctx(t, time.Minute), info.ID, 15); err != nil {
		t.Fatalf("SignalProcess(%d, 15) = %v", info.ID, err)
	}
	got := waitProc(t, c, info.ID, exited)
	if want := (&proto.Exit{Code: 143, Signal: 15}); !cmp.Equal(got.Exit, want) {
		t.Errorf("exit after SIGTERM = %+v, want %+v", got.Exit, want)
	}
	// Signalling an exited process does nothing.
	if err := c.SignalProcess(ctx(t, time.Minute), info.ID, 9); err != nil {
		t.Errorf("SignalProcess(exited) = %v, want nil", err)
	}
}

// testProcKillOnDetach: with KillOnDetach a detach kills the group; without
// it the process goes on, detached.
func testProcKillOnDetach(t *testing.T, c *client.Client) {
	for _, kill := range []bool{true, false} {
		t.Run(fmt.Sprintf("kill_on_detach=%v", kill), func(t *testing.T) {
			p, info, err := c.StartAttached(ctx(t, time.Minute), proto.ProcStart{
				ExecRequest: proto.ExecRequest{Argv: []string{"sleep", "60"}}, KillOnDetach: kill}, client.IO{})
			if err != nil {
				t.Fatalf("StartAttached(sleep 60) = %v", err)
			}
			p.Detach()
			if _, err := p.Wait(); !errors.Is(err, client.ErrDetached) {
				t.Errorf("Wait() after Detach = %v, want ErrDetached", err)
			}
			if kill {
				got := waitProc(t, c, info.ID, exited)
				if want := (&proto.Exit{Code: 137, Signal: 9}); !cmp.Equal(got.Exit, want) {
					t.Errorf("exit after detach = %+v, want %+v", got.Exit, want)
				}
				return
			}
			got := waitProc(t, c, info.ID, func(p proto.ProcInfo) bool { return !p.Attached })
			if !got.Running {
				t.Errorf("after detach: %+v, want it running", got)
			}
			if err := c.SignalProcess(ctx(t, time.Minute), info.ID, 9); err != nil {
				t.Errorf("SignalProcess(9) = %v", err)
			}
		})
	}
}

func testProcTimeout(t *testing.T, c *client.Client) {
	info, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"sleep", "60"}, TimeoutMS: 200}})
	if err != nil {
		t.Fatalf("StartProcess(sleep 60, timeout 200ms) = %v", err)
	}
	got := waitProc(t, c, info.ID, exited)
	if want := (&proto.Exit{Code: 137, Signal: 9, TimedOut: true}); !cmp.Equal(got.Exit, want) {
		t.Errorf("exit of detached process past its timeout = %+v, want %+v", got.Exit, want)
	}
}

// testProcPTY: a terminal process started detached is resized and driven
// through a later attachment.
func testProcPTY(t *testing.T, c *client.Client) {
	info, err := c.StartProcess(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"sh"}, PTY: &proto.WinSize{Rows: 24, Cols: 80}}})
	if err != nil {
		t.Fatalf("StartProcess(sh on pty) = %v", err)
	}
	if !info.PTY {
		t.Errorf("StartProcess info = %+v, want pty", info)
	}
	var buf lockedBuffer
	p, _, err := c.Attach(ctx(t, time.Minute), info.ID, client.IO{Stdout: &buf})
	if err != nil {
		t.Fatalf("Attach(%d) = %v", info.ID, err)
	}
	if err := p.Resize(40, 132); err != nil {
		t.Fatalf("Resize = %v", err)
	}
	if err := p.WriteStdin([]byte("stty size; exit 3\n")); err != nil {
		t.Fatalf("WriteStdin = %v", err)
	}
	exit, err := p.Wait()
	if err != nil || exit.Code != 3 {
		t.Fatalf("sh on pty = %+v, %v; output %q", exit, err, buf.String())
	}
	if !strings.Contains(buf.String(), "40 132") {
		t.Errorf("pty output after resize = %q, want it to contain %q", buf.String(), "40 132")
	}
}

func testProcErrors(t *testing.T, c *client.Client) {
	const unknown = 1 << 60
	tests := []struct {
		name string
		call func(context.Context) error
		kind error
	}{
		{"attach unknown", func(ctx context.Context) error { _, _, err := c.Attach(ctx, unknown, client.IO{}); return err }, errkind.NotFound},
		{"signal unknown", func(ctx context.Context) error { return c.SignalProcess(ctx, unknown, 15) }, errkind.NotFound},
		{"bad signal", func(ctx context.Context) error { return c.SignalProcess(ctx, 1, 0) }, errkind.InvalidArgument},
		{"start nothing", func(ctx context.Context) error { _, err := c.StartProcess(ctx, proto.ProcStart{}); return err }, errkind.InvalidArgument},
		{"start missing program", func(ctx context.Context) error {
			_, err := c.StartProcess(ctx, proto.ProcStart{ExecRequest: proto.ExecRequest{Argv: []string{"no-such-program-xyz"}}})
			return err
		}, errkind.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(ctx(t, time.Minute)); !errors.Is(err, tt.kind) {
				t.Errorf("got %v, want kind %v", err, tt.kind)
			}
		})
	}
}

// testProcReconnect: a process outlives the connection that started it;
// output it writes while nobody is attached waits in the agent, and a new
// connection attaches and gets that output and the exit. It replaces *cp
// with the new connection.
func testProcReconnect(t *testing.T, cp **client.Client, opts Options) {
	c := *cp
	flag := opts.Scratch + "/proc-reconnect-go"
	Output(t, c, "rm -f "+flag)
	var out1 lockedBuffer
	p1, info, err := c.StartAttached(ctx(t, time.Minute), proto.ProcStart{ExecRequest: proto.ExecRequest{
		Shell: "echo first; while [ ! -e " + flag + " ]; do sleep 0.02; done; echo second; exit 3",
	}}, client.IO{Stdout: &out1})
	if err != nil {
		t.Fatalf("StartAttached = %v", err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool { return out1.String() == "first\n" })

	nc, err := opts.Reconnect(ctx(t, time.Minute), c)
	if err != nil {
		t.Fatalf("Reconnect = %v", err)
	}
	*cp, c = nc, nc
	if _, err := p1.Wait(); !errors.Is(err, client.ErrDetached) {
		t.Errorf("Wait() after the connection closed = %v, want ErrDetached", err)
	}
	waitProc(t, c, info.ID, func(p proto.ProcInfo) bool { return !p.Attached })
	Output(t, c, "touch "+flag)
	waitProc(t, c, info.ID, exited) // "second" waits in the agent

	var out2 bytes.Buffer
	p2, got, err := c.Attach(ctx(t, time.Minute), info.ID, client.IO{Stdout: &out2})
	if err != nil {
		t.Fatalf("Attach(%d) on a new connection = %v", info.ID, err)
	}
	if got.Running || got.BufferedBytes != int64(len("second\n")) || got.DroppedBytes != 0 {
		t.Errorf("Attach(%d) info = %+v, want exited with 7 bytes buffered", info.ID, got)
	}
	exit, err := p2.Wait()
	if err != nil || exit.Code != 3 {
		t.Errorf("Wait() = %+v, %v; want exit 3", exit, err)
	}
	if got := out2.String(); got != "second\n" {
		t.Errorf("output on the new connection = %q, want %q", got, "second\n")
	}
	Output(t, c, "rm -f "+flag)
}

// testProcUnlisted checks that an exec asking to be unlisted is not in
// the table once it exited, while an ordinary one is.
func testProcUnlisted(t *testing.T, c *client.Client) {
	for _, unlisted := range []bool{true, false} {
		shell := fmt.Sprintf("exit 0 # unlisted=%v", unlisted)
		if exit, err := c.Exec(ctx(t, time.Minute), proto.ExecRequest{Shell: shell, Unlisted: unlisted}, client.IO{}); err != nil || exit.Code != 0 {
			t.Fatalf("Exec(%q) = %+v, %v", shell, exit, err)
		}
		testenv.Eventually(t, 30*time.Second, func() bool {
			ps, err := c.Processes(ctx(t, time.Minute))
			if err != nil {
				t.Fatalf("Processes() = %v", err)
			}
			for _, p := range ps {
				if p.Shell == shell {
					return !unlisted && !p.Running // listed, as exited
				}
			}
			return unlisted
		})
	}
}

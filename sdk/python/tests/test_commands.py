"""commands.run (streaming, stdin, env/cwd/user/timeout, exit codes, the
50 MiB stream), background commands, re-attach, signals and the PTY."""

from __future__ import annotations

import hashlib
import time
from typing import List, Tuple

import pytest

from space_sdk import CommandExitError, Sandbox, Space


def test_run_exit_code_and_streams(shared: Sandbox) -> None:
    r = shared.commands.run("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("out\n", "err\n", 3, False)
    r = shared.commands.run(["printf", "%s|", "a b", "c"])
    assert r.stdout == "a b|c|" and r.exit_code == 0


def test_run_streams_callbacks_as_output_arrives(shared: Sandbox) -> None:
    got: List[Tuple[float, str, str]] = []
    t0 = time.monotonic()
    r = shared.commands.run(
        "echo first; echo e1 >&2; sleep 2; echo second",
        on_stdout=lambda s: got.append((time.monotonic() - t0, "out", s)),
        on_stderr=lambda s: got.append((time.monotonic() - t0, "err", s)),
    )
    end = time.monotonic() - t0
    assert "".join(s for _, k, s in got if k == "out") == "first\nsecond\n"
    assert "".join(s for _, k, s in got if k == "err") == "e1\n"
    first = next(t for t, k, s in got if "first" in s)
    assert first < end - 1.5, "the first line must arrive before the command ends"
    assert r.stdout == "first\nsecond\n"


def test_run_bytes_safe(shared: Sandbox) -> None:
    r = shared.commands.run(["printf", r"\377\000\303\251"])
    assert r.stdout_bytes == b"\xff\x00\xc3\xa9"
    assert r.stdout == "\ufffd\x00\u00e9"


def test_run_stdin(shared: Sandbox) -> None:
    data = bytes(range(256)) * 1000
    r = shared.commands.run("sha256sum", stdin=data)
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert shared.commands.run("cat", stdin="héllo").stdout == "héllo"
    # No stdin: the command sees EOF at once.
    assert shared.commands.run("cat", timeout=20).exit_code == 0


def test_run_env_cwd(shared: Sandbox) -> None:
    r = shared.commands.run('echo "$FOO|$PWD"', env={"FOO": "bar baz"}, cwd="/tmp")
    assert r.stdout == "bar baz|/tmp\n"


def test_run_user(shared: Sandbox) -> None:
    if shared.info and shared.info.vm and shared.info.vm.vmm == "fake":
        pytest.skip("the fake VMM's guests are unprivileged host processes: they cannot change user")
    r = shared.commands.run('echo "$(id -un) $(id -u)"', user="nobody")
    assert r.stdout == "nobody 65534\n"
    assert shared.commands.run("id -u", user="0").stdout.strip() == "0"


def test_run_timeout(shared: Sandbox) -> None:
    t0 = time.monotonic()
    r = shared.commands.run("sleep 60", timeout=2)
    assert r.timed_out and r.exit_code != 0
    assert time.monotonic() - t0 < 30


def test_run_check(shared: Sandbox) -> None:
    with pytest.raises(CommandExitError) as ei:
        shared.commands.run("echo nope >&2; exit 4", check=True)
    assert ei.value.result.exit_code == 4 and "nope" in str(ei.value)


@pytest.mark.slow
def test_50_mib_stdout_arrives_byte_exact(shared: Sandbox) -> None:
    n = 50 << 20
    got = [0]
    r = shared.commands.run(
        "head -c %d /dev/urandom | tee /tmp/big.bin" % n, on_stdout=lambda s: got.__setitem__(0, got[0] + 1)
    )
    assert r.exit_code == 0 and len(r.stdout_bytes) == n
    assert got[0] > 1, "output must stream in several pieces"
    guest = shared.commands.run("sha256sum /tmp/big.bin").stdout.split()[0]
    assert hashlib.sha256(r.stdout_bytes).hexdigest() == guest
    shared.files.remove("/tmp/big.bin")


def test_background_stdin_and_wait(shared: Sandbox) -> None:
    chunks: List[str] = []
    h = shared.commands.run("read a; echo got:$a; cat; echo end", background=True, on_stdout=chunks.append)
    assert h.pid > 0 and h.guest_pid > 0 and not h.done
    h.send_stdin("one\n")
    h.send_stdin(b"two\n")
    h.close_stdin()
    r = h.wait(timeout=30)
    assert r.stdout == "got:one\ntwo\nend\n" and r.exit_code == 0 and r.pid == h.pid
    assert "".join(chunks) == r.stdout
    procs = {p.id: p for p in shared.commands.list()}
    assert h.pid in procs and procs[h.pid].running is False and procs[h.pid].exit is not None


def test_background_outlives_dropped_client_and_is_reattached(space: Space, shared: Sandbox) -> None:
    # A client of its own, closed without detaching: its connection just drops.
    other = Space()
    first: List[str] = []
    sb = other.sandboxes.connect(shared.id)
    h = sb.commands.run("echo start; sleep 2; echo detached; sleep 2; echo live; exit 7",
                        background=True, on_stdout=first.append)
    pid = h.pid
    _wait_for(lambda: "start" in "".join(first))
    other.close()
    time.sleep(3)  # "detached" is written while no client is attached
    p = shared.commands.get(pid)
    assert p.running and not p.attached, "the command must outlive its client"
    r = space.sandboxes.connect(shared.id).commands.connect(pid).wait(timeout=60)
    assert r.exit_code == 7
    # Re-attaching replays what no client received (buffered), then live output.
    assert r.stdout == "detached\nlive\n"


def test_disconnect_and_output(shared: Sandbox) -> None:
    h = shared.commands.run("sleep 1; echo later", background=True)
    h.disconnect()
    r = shared.commands.output(h.pid)  # read-only NDJSON follow
    assert r.stdout == "later\n" and r.exit_code == 0


def test_tag_and_shared_connect(shared: Sandbox) -> None:
    out1: List[str] = []
    out2: List[str] = []
    h = shared.commands.run('while read l; do echo "got $l"; done', background=True, tag="echoer",
                            on_stdout=out1.append)
    assert shared.commands.get(h.pid).tag == "echoer"
    h2 = shared.commands.connect(h.pid, on_stdout=out2.append, share=True)
    h.send_stdin("one\n")
    _wait_for(lambda: "".join(out1) == "got one\n" and "".join(out2) == "got one\n")
    h.close_stdin()
    r, r2 = h.wait(timeout=30), h2.wait(timeout=30)
    assert (r.exit_code, r2.exit_code, r.stdout, r2.stdout) == (0, 0, "got one\n", "got one\n")


def test_kill_on_disconnect(space: Space, shared: Sandbox) -> None:
    other = Space()
    h = other.sandboxes.connect(shared.id).commands.run("sleep 60", background=True, kill_on_disconnect=True)
    pid = h.pid
    other.close()
    deadline = time.monotonic() + 20
    while shared.commands.get(pid).running and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not shared.commands.get(pid).running


def test_signals(shared: Sandbox) -> None:
    h = shared.commands.run("trap 'echo TERM; exit 42' TERM; echo ready; while true; do sleep 0.1; done",
                            background=True)
    time.sleep(1)  # let the shell set its trap
    h.signal(15)
    r = h.wait(timeout=30)
    assert r.exit_code == 42 and "TERM" in r.stdout
    h2 = shared.commands.run("sleep 60", background=True)
    h2.kill()
    r2 = h2.wait(timeout=30)
    assert r2.signal == 9 or r2.exit_code == 137
    # By Process id, without a handle.
    h3 = shared.commands.run("sleep 60", background=True)
    shared.commands.signal(h3.pid, 15)
    r3 = h3.wait(timeout=30)
    assert r3.signal == 15 or r3.exit_code == 143


def test_pty_echo_and_resize(shared: Sandbox) -> None:
    seen: List[bytes] = []
    t = shared.pty.create(cols=80, rows=24, on_data=seen.append)
    t.send_input("stty size; echo pty-$((6*7))\n")
    _wait_for(lambda: b"pty-42" in t.output and b"24 80" in t.output)
    t.resize(cols=100, rows=40)
    t.send_input("stty size\n")
    _wait_for(lambda: b"40 100" in t.output)
    t.send_input("exit 5\n")
    r = t.wait(timeout=30)
    assert r.exit_code == 5
    assert b"".join(seen) == t.output == r.stdout_bytes
    assert r.stderr_bytes == b"", "a terminal's output is all stdout"


def test_pty_kill(shared: Sandbox) -> None:
    t = shared.pty.create(cmd=["sleep", "60"])
    t.kill()
    r = t.wait(timeout=30)
    assert r.signal == 9 or r.exit_code == 137


def _wait_for(cond, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.1)


"""Running commands in a sandbox: ``sandbox.commands``.

A foreground ``run`` streams POST /v1/sandboxes/{id}/exec (NDJSON events,
output base64 in JSON). A background ``run`` and ``connect`` use the
WebSocket routes (exec/ws, processes/{pid}/attach): binary messages
``[stream byte] + bytes`` (0 stdin, 1 stdout, 2 stderr) and text JSON
messages (Control from the client; started/exit/error Events from the
server).
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import inspect
import json
import math
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
    Literal,
    overload,
)

import httpx

from . import _types as T
from ._errors import CommandExitError, SpaceError, StreamCutError, error_from_event
from ._http import AsyncHTTP, Req, SyncHTTP, sandbox_path, split_lines
from ._ws import STDERR, STDIN, STDOUT, LoopThread, WSConn, ws_connect

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox, Sandbox

__all__ = ["CommandResult", "Commands", "AsyncCommands", "CommandHandle", "AsyncCommandHandle"]

#: An output callback: gets each piece of output as it arrives (str for
#: commands, decoded as UTF-8 with errors="replace"; bytes for a PTY). In
#: the async API it may be a coroutine function.
OutputCallback = Callable[[Any], Any]
Cmd = Union[str, Sequence[str]]
StdinData = Union[bytes, str, None]

STDIN_CHUNK = 1 << 20


@dataclass
class CommandResult:
    """How a command ended and what it wrote (bytes kept exactly)."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    exit_code: int
    signal: Optional[int] = None
    timed_out: bool = False
    pid: Optional[int] = None  # the Process id (API), for processes routes

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class _Output:
    """Sans-IO: collects a command's output and events, calls callbacks."""

    def __init__(
        self,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        text: bool = True,
        capture: bool = True,
    ) -> None:
        self.cbs = {STDOUT: on_stdout, STDERR: on_stderr}
        self.text = text
        self.capture = capture
        self.bufs = {STDOUT: bytearray(), STDERR: bytearray()}
        self.decoders = {
            STDOUT: codecs.getincrementaldecoder("utf-8")("replace"),
            STDERR: codecs.getincrementaldecoder("utf-8")("replace"),
        }
        self.process: Optional[T.Process] = None
        self.exit: Optional[T.Exit] = None

    def write(self, stream: int, data: bytes) -> List[Any]:
        """Take output of a stream; returns what the callback returned."""
        if stream not in self.bufs or not data:
            return []
        if self.capture:
            self.bufs[stream] += data
        cb = self.cbs[stream]
        if cb is None:
            return []
        if not self.text:
            return [cb(data)]
        s = self.decoders[stream].decode(data)
        return [cb(s)] if s else []

    def flush(self) -> List[Any]:
        res = []
        if self.text:
            for stream, dec in self.decoders.items():
                s = dec.decode(b"", final=True)
                cb = self.cbs[stream]
                if s and cb is not None:
                    res.append(cb(s))
        return res

    def event(self, ev: Mapping[str, Any]) -> "tuple[bool, List[Any]]":
        """Take an event; (done, callback results). An error event raises."""
        typ = ev.get("type")
        if typ == "stdout" or typ == "stderr":
            data = base64.b64decode(ev.get("data") or b"")
            return False, self.write(STDOUT if typ == "stdout" else STDERR, data)
        if typ == "started":
            if ev.get("process"):
                self.process = T.Process.from_dict(ev["process"])
            return False, []
        if typ == "exit":
            self.exit = T.Exit.from_dict(ev.get("exit") or {})
            return True, self.flush()
        if typ == "error":
            raise error_from_event(ev.get("error"))
        return False, []  # kinds this SDK does not know

    def result(self) -> CommandResult:
        ex = self.exit or T.Exit(code=-1)
        return CommandResult(
            stdout_bytes=bytes(self.bufs[STDOUT]),
            stderr_bytes=bytes(self.bufs[STDERR]),
            exit_code=ex.code,
            signal=ex.signal,
            timed_out=bool(ex.timed_out),
            pid=self.process.id if self.process else None,
        )


def _to_bytes(data: Union[bytes, str, bytearray, memoryview]) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def build_exec(
    cmd: Cmd,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str] = None,
    user: Optional[str] = None,
    timeout: Optional[float] = None,
    stdin: StdinData = None,
    kill_on_disconnect: bool = False,
    tty: Optional[T.WinSize] = None,
    tag: Optional[str] = None,
) -> T.Exec:
    """The Exec of a command: a str is a shell line (/bin/sh -c), a list an argv."""
    if isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd: a str (shell line) or a list of str (argv)")
    ex = T.Exec(
        env=dict(env) if env else None,
        cwd=cwd,
        user=user,
        timeout_seconds=int(math.ceil(timeout)) if timeout else None,
        stdin=_to_bytes(stdin) if stdin else None,
        kill_on_disconnect=True if kill_on_disconnect else None,
        tty=tty,
        tag=tag or None,
    )
    if isinstance(cmd, str):
        ex.shell = cmd
    else:
        ex.command = [str(a) for a in cmd]
        if not ex.command:
            raise ValueError("cmd: an empty argv")
    return ex


def _exec_req(sandbox_id: str, ex: T.Exec) -> Req:
    return Req(
        "POST",
        sandbox_path(sandbox_id, "/exec"),
        json=ex.to_dict(),
        sandbox=sandbox_id,
        accept="application/x-ndjson",
    )


def _process_path(sandbox_id: str, pid: int, rest: str = "") -> str:
    return sandbox_path(sandbox_id, "/processes/%d%s" % (int(pid), rest))


def _signal_req(sandbox_id: str, pid: int, sig: int) -> Req:
    return Req("POST", _process_path(sandbox_id, pid, "/signal"), json={"signal": int(sig)},
               sandbox=sandbox_id, expect=(204, 200))


def _finish(result: CommandResult, check: bool) -> CommandResult:
    if check and not result.ok:
        raise CommandExitError(result)
    return result


async def _await_all(values: List[Any]) -> None:
    for v in values:
        if inspect.isawaitable(v):
            await v


# --- WebSocket sessions (async core; the sync handle drives it on a LoopThread)


class AsyncCommandHandle:
    """A command attached over a WebSocket: stream stdin to it, signal it,
    wait for it. ``pid`` is the Process id the processes routes take."""

    def __init__(self, http: AsyncHTTP, sandbox_id: str, conn: WSConn, out: _Output) -> None:
        self._http = http
        self.sandbox_id = sandbox_id
        self._conn = conn
        self._out = out
        self._detached = False
        self._task: "asyncio.Task[CommandResult]" = asyncio.ensure_future(self._read())
        http.sessions.add(self)
        self._task.add_done_callback(self._ended)

    def _ended(self, task: "asyncio.Task[CommandResult]") -> None:
        self._http.sessions.discard(self)
        if not task.cancelled():
            task.exception()  # retrieved here; wait() raises it

    @classmethod
    async def _open(
        cls, http: AsyncHTTP, sandbox_id: str, path: str, first: Optional[Dict[str, Any]], out: _Output
    ) -> "AsyncCommandHandle":
        conn = await ws_connect(http, sandbox_id, path)
        try:
            if first is not None:
                await conn.send_json(first)
            msg = await conn.recv()  # the started (or error) event comes first
            if not isinstance(msg, str):
                raise SpaceError("internal", "the server sent output before the started event")
            out.event(json.loads(msg))
            if out.process is None:
                raise SpaceError("internal", "the server's first message was not a started event")
        except BaseException:
            await conn.close()
            raise
        return cls(http, sandbox_id, conn, out)

    @property
    def process(self) -> T.Process:
        assert self._out.process is not None
        return self._out.process

    @property
    def pid(self) -> int:
        """The Process id (API), for ``commands.connect`` / signal routes."""
        return self.process.id

    @property
    def guest_pid(self) -> int:
        """The process ID inside the guest."""
        return self.process.pid

    @property
    def done(self) -> bool:
        return self._task.done()

    async def _read(self) -> CommandResult:
        import websockets

        try:
            while True:
                try:
                    msg = await self._conn.recv()
                except websockets.exceptions.ConnectionClosed as exc:
                    if self._detached:
                        return self._out.result()
                    raise StreamCutError("connection closed before the command exited: %s" % exc) from None
                if isinstance(msg, bytes):
                    if msg:
                        await _await_all(self._out.write(msg[0], msg[1:]))
                    continue
                try:
                    done, pending = self._out.event(json.loads(msg))
                except SpaceError:
                    if self._detached:
                        return self._out.result()
                    raise
                await _await_all(pending)
                if done:
                    return self._out.result()
        finally:
            await self._conn.close()

    async def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Wait for the command to exit and return its result. A timeout
        raises asyncio.TimeoutError and leaves the command (and handle) alone."""
        return await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def send_stdin(self, data: Union[bytes, str]) -> None:
        b = _to_bytes(data)
        for i in range(0, len(b), STDIN_CHUNK):
            await self._conn.send(bytes([STDIN]) + b[i : i + STDIN_CHUNK])

    async def close_stdin(self) -> None:
        await self._conn.send_json({"type": "stdin_eof"})

    async def resize(self, cols: int, rows: int) -> None:
        await self._conn.send_json({"type": "resize", "rows": int(rows), "cols": int(cols)})

    async def signal(self, sig: int) -> None:
        """Send signal number sig (e.g. 15) to the command."""
        await self._http.send(_signal_req(self.sandbox_id, self.pid, sig))

    async def kill(self) -> None:
        await self.signal(9)

    async def _drop(self) -> None:
        """Close the connection as a client that goes away would (no detach
        control): the command keeps running unless kill_on_disconnect."""
        if self._task.done():
            return
        self._detached = True
        await self._conn.close()
        self._task.cancel()
        try:
            await self._task
        except BaseException:  # noqa: BLE001 - cancelled or cut
            pass

    async def disconnect(self) -> None:
        """Leave the command running and stop following it (re-attach
        later with ``commands.connect(pid)``)."""
        if self._task.done():
            return
        self._detached = True
        try:
            await self._conn.send_json({"type": "detach"})
        except Exception:  # noqa: BLE001 - closed already
            pass
        await self._conn.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 10)
        except Exception:  # noqa: BLE001
            self._task.cancel()


class CommandHandle:
    """The sync face of :class:`AsyncCommandHandle`. Output callbacks run
    on the SDK's private event loop thread."""

    def __init__(self, loop: LoopThread, handle: AsyncCommandHandle) -> None:
        self._loop = loop
        self._h = handle

    @property
    def process(self) -> T.Process:
        return self._h.process

    @property
    def pid(self) -> int:
        return self._h.pid

    @property
    def guest_pid(self) -> int:
        return self._h.guest_pid

    @property
    def done(self) -> bool:
        return self._h.done

    def wait(self, timeout: Optional[float] = None) -> CommandResult:
        """Wait for the exit; a timeout raises TimeoutError and leaves the command alone."""
        async def _w() -> CommandResult:
            return await asyncio.shield(self._h._task)

        return self._loop.run(_w(), timeout)

    def send_stdin(self, data: Union[bytes, str]) -> None:
        self._loop.run(self._h.send_stdin(data))

    def close_stdin(self) -> None:
        self._loop.run(self._h.close_stdin())

    def resize(self, cols: int, rows: int) -> None:
        self._loop.run(self._h.resize(cols, rows))

    def signal(self, sig: int) -> None:
        self._loop.run(self._h.signal(sig))

    def kill(self) -> None:
        self._loop.run(self._h.kill())

    def disconnect(self) -> None:
        self._loop.run(self._h.disconnect())


# --- the sandbox.commands objects


# INTERPRETERS run a snippet read from stdin, by language (run_code).
INTERPRETERS = {
    "python": ["python3", "-"],
    "javascript": ["node", "-"],
    "shell": ["/bin/sh", "-s"],
    "bash": ["/bin/bash", "-s"],
}


def _interpreter(language: str) -> List[str]:
    try:
        return INTERPRETERS[language]
    except KeyError:
        raise ValueError("language %r: want one of %s" % (language, ", ".join(INTERPRETERS))) from None


class AsyncCommands:
    """``sandbox.commands`` of the async API."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    @property
    def _http(self) -> AsyncHTTP:
        return self._sb._space._http

    @overload
    async def run(self, cmd: Cmd, *, background: Literal[False] = False, env: Optional[Mapping[str, str]] = ...,
                  cwd: Optional[str] = ..., user: Optional[str] = ..., timeout: Optional[float] = ...,
                  stdin: StdinData = ..., on_stdout: Optional[OutputCallback] = ...,
                  on_stderr: Optional[OutputCallback] = ..., check: bool = ...,
                  kill_on_disconnect: bool = ..., tag: Optional[str] = ...) -> CommandResult: ...

    @overload
    async def run(self, cmd: Cmd, *, background: Literal[True], env: Optional[Mapping[str, str]] = ...,
                  cwd: Optional[str] = ..., user: Optional[str] = ..., timeout: Optional[float] = ...,
                  stdin: StdinData = ..., on_stdout: Optional[OutputCallback] = ...,
                  on_stderr: Optional[OutputCallback] = ..., check: bool = ...,
                  kill_on_disconnect: bool = ..., tag: Optional[str] = ...) -> AsyncCommandHandle: ...

    async def run(
        self,
        cmd: Cmd,
        *,
        background: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: StdinData = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        kill_on_disconnect: bool = False,
        tag: Optional[str] = None,
    ) -> Union[CommandResult, AsyncCommandHandle]:
        """Run cmd (a shell line, or an argv list) and return its
        CommandResult; with background=True return a handle at once."""
        out = _Output(on_stdout, on_stderr)
        if background:
            ex = build_exec(cmd, env, cwd, user, timeout, None, kill_on_disconnect, tag=tag)
            h = await AsyncCommandHandle._open(
                self._http, self._sb.id, sandbox_path(self._sb.id, "/exec/ws"), ex.to_dict(), out
            )
            if stdin:
                await h.send_stdin(stdin)
                await h.close_stdin()
            return h
        ex = build_exec(cmd, env, cwd, user, timeout, stdin, kill_on_disconnect, tag=tag)
        return _finish(await _ndjson_async(self._http, _exec_req(self._sb.id, ex), out), check)

    async def run_code(self, code: str, language: str = "python", **kw: Any) -> CommandResult:
        """Run a snippet (python, javascript, shell or bash), fed to its
        interpreter on stdin; keyword arguments as for run (not stdin)."""
        return await self.run(_interpreter(language), stdin=code, **kw)

    async def connect(
        self, pid: int, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
        *, share: bool = False,
    ) -> AsyncCommandHandle:
        """Attach to a running command by its Process id: its buffered
        output (up to 1 MiB) is replayed, then live output follows. An
        earlier handle of the command is taken over (it ends), unless
        share is set: then both follow it, this one from now on."""
        out = _Output(on_stdout, on_stderr)
        path = _process_path(self._sb.id, pid, "/attach") + ("?share=true" if share else "")
        return await AsyncCommandHandle._open(self._http, self._sb.id, path, None, out)

    async def list(self) -> List[T.Process]:
        doc = await self._http.json(Req("GET", sandbox_path(self._sb.id, "/processes"), sandbox=self._sb.id,
                                        idempotent=True))
        return T.ProcessList.from_dict(doc).processes

    async def get(self, pid: int) -> T.Process:
        doc = await self._http.json(Req("GET", _process_path(self._sb.id, pid), sandbox=self._sb.id,
                                        idempotent=True))
        return T.Process.from_dict(doc)

    async def output(
        self, pid: int, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None
    ) -> CommandResult:
        """Follow a command's output read-only until it exits (NDJSON route)."""
        req = Req("GET", _process_path(self._sb.id, pid, "/output"), sandbox=self._sb.id,
                  accept="application/x-ndjson", idempotent=True)
        return await _ndjson_async(self._http, req, _Output(on_stdout, on_stderr))

    async def signal(self, pid: int, sig: int) -> None:
        await self._http.send(_signal_req(self._sb.id, pid, sig))

    async def kill(self, pid: int) -> None:
        await self.signal(pid, 9)


class Commands:
    """``sandbox.commands`` of the sync API."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    @property
    def _http(self) -> SyncHTTP:
        return self._sb._space._http

    def _ws(self, coro: Awaitable[AsyncCommandHandle]) -> CommandHandle:
        loop = self._sb._space._loop()
        return CommandHandle(loop, loop.run(coro))  # type: ignore[arg-type]

    @overload
    def run(self, cmd: Cmd, *, background: Literal[False] = False, env: Optional[Mapping[str, str]] = ...,
            cwd: Optional[str] = ..., user: Optional[str] = ..., timeout: Optional[float] = ...,
            stdin: StdinData = ..., on_stdout: Optional[OutputCallback] = ...,
            on_stderr: Optional[OutputCallback] = ..., check: bool = ...,
            kill_on_disconnect: bool = ..., tag: Optional[str] = ...) -> CommandResult: ...

    @overload
    def run(self, cmd: Cmd, *, background: Literal[True], env: Optional[Mapping[str, str]] = ...,
            cwd: Optional[str] = ..., user: Optional[str] = ..., timeout: Optional[float] = ...,
            stdin: StdinData = ..., on_stdout: Optional[OutputCallback] = ...,
            on_stderr: Optional[OutputCallback] = ..., check: bool = ...,
            kill_on_disconnect: bool = ..., tag: Optional[str] = ...) -> CommandHandle: ...

    def run(
        self,
        cmd: Cmd,
        *,
        background: bool = False,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        stdin: StdinData = None,
        on_stdout: Optional[OutputCallback] = None,
        on_stderr: Optional[OutputCallback] = None,
        check: bool = False,
        kill_on_disconnect: bool = False,
        tag: Optional[str] = None,
    ) -> Union[CommandResult, CommandHandle]:
        """Run cmd (a shell line, or an argv list) and return its
        CommandResult; with background=True return a CommandHandle at once.
        Foreground callbacks run on the calling thread."""
        if background:
            a = self._sb._space._async_sandbox(self._sb.id).commands
            return self._ws(
                a.run(cmd, background=True, env=env, cwd=cwd, user=user, timeout=timeout, stdin=stdin,
                      on_stdout=on_stdout, on_stderr=on_stderr, kill_on_disconnect=kill_on_disconnect, tag=tag)
            )
        ex = build_exec(cmd, env, cwd, user, timeout, stdin, kill_on_disconnect, tag=tag)
        out = _Output(on_stdout, on_stderr)
        return _finish(_ndjson_sync(self._http, _exec_req(self._sb.id, ex), out), check)

    def run_code(self, code: str, language: str = "python", **kw: Any) -> CommandResult:
        """Run a snippet (python, javascript, shell or bash), fed to its
        interpreter on stdin; keyword arguments as for run (not stdin)."""
        return self.run(_interpreter(language), stdin=code, **kw)

    def connect(
        self, pid: int, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None,
        *, share: bool = False,
    ) -> CommandHandle:
        """Attach to a running command by its Process id (see AsyncCommands.connect)."""
        a = self._sb._space._async_sandbox(self._sb.id).commands
        return self._ws(a.connect(pid, on_stdout, on_stderr, share=share))

    def list(self) -> List[T.Process]:
        doc = self._http.json(Req("GET", sandbox_path(self._sb.id, "/processes"), sandbox=self._sb.id,
                                  idempotent=True))
        return T.ProcessList.from_dict(doc).processes

    def get(self, pid: int) -> T.Process:
        doc = self._http.json(Req("GET", _process_path(self._sb.id, pid), sandbox=self._sb.id, idempotent=True))
        return T.Process.from_dict(doc)

    def output(
        self, pid: int, on_stdout: Optional[OutputCallback] = None, on_stderr: Optional[OutputCallback] = None
    ) -> CommandResult:
        """Follow a command's output read-only until it exits (NDJSON route)."""
        req = Req("GET", _process_path(self._sb.id, pid, "/output"), sandbox=self._sb.id,
                  accept="application/x-ndjson", idempotent=True)
        return _ndjson_sync(self._http, req, _Output(on_stdout, on_stderr))

    def signal(self, pid: int, sig: int) -> None:
        self._http.send(_signal_req(self._sb.id, pid, sig))

    def kill(self, pid: int) -> None:
        self.signal(pid, 9)


# --- NDJSON streams


def _ndjson_sync(http: SyncHTTP, req: Req, out: _Output) -> CommandResult:
    try:
        with http.stream(req) as resp:
            buf = bytearray()
            for chunk in resp.iter_bytes():
                for line in split_lines(buf, chunk):
                    done, _ = out.event(json.loads(line))
                    if done:
                        return out.result()
    except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
        raise StreamCutError("output stream cut: %s" % exc) from None
    raise StreamCutError()


async def _ndjson_async(http: AsyncHTTP, req: Req, out: _Output) -> CommandResult:
    try:
        async with http.stream(req) as resp:
            buf = bytearray()
            async for chunk in resp.aiter_bytes():
                for line in split_lines(buf, chunk):
                    done, pending = out.event(json.loads(line))
                    await _await_all(pending)
                    if done:
                        return out.result()
    except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
        raise StreamCutError("output stream cut: %s" % exc) from None
    raise StreamCutError()

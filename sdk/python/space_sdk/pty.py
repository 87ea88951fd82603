"""Terminal sessions: ``sandbox.pty`` (exec/ws with ``tty`` set).

A terminal's output is all stdout and raw bytes: ``on_data`` gets bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from . import _types as T
from ._http import sandbox_path
from .commands import AsyncCommandHandle, CommandHandle, _Output, build_exec

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox, Sandbox

__all__ = ["Pty", "AsyncPty", "PtyHandle", "AsyncPtyHandle"]

DataCallback = Callable[[bytes], Any]
DEFAULT_SHELL = ["/bin/bash", "-i"]


class AsyncPtyHandle(AsyncCommandHandle):
    """A command on a terminal: ``send_input``, ``resize``, ``wait``, ``kill``."""

    async def send_input(self, data: Union[bytes, str]) -> None:
        await self.send_stdin(data)

    @property
    def output(self) -> bytes:
        """Everything the terminal printed so far."""
        return bytes(self._out.bufs[1])


class PtyHandle(CommandHandle):
    """The sync face of :class:`AsyncPtyHandle` (callbacks run on the SDK's loop thread)."""

    _h: AsyncPtyHandle

    def send_input(self, data: Union[bytes, str]) -> None:
        self.send_stdin(data)

    @property
    def output(self) -> bytes:
        return self._h.output


def _pty_first(
    cols: int,
    rows: int,
    cmd: Optional[Union[str, Sequence[str]]],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    timeout: Optional[float],
) -> Any:
    e = {"TERM": "xterm-256color"}
    e.update(env or {})
    return build_exec(cmd or DEFAULT_SHELL, e, cwd, user, timeout, tty=T.WinSize(rows=int(rows), cols=int(cols)))


class AsyncPty:
    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def create(
        self,
        cols: int = 80,
        rows: int = 24,
        on_data: Optional[DataCallback] = None,
        *,
        cmd: Optional[Union[str, Sequence[str]]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> AsyncPtyHandle:
        """Start cmd (default an interactive bash) on a cols x rows terminal."""
        ex = _pty_first(cols, rows, cmd, env, cwd, user, timeout)
        out = _Output(on_data, None, text=False)
        h = await AsyncPtyHandle._open(
            self._sb._space._http, self._sb.id, sandbox_path(self._sb.id, "/exec/ws"), ex.to_dict(), out
        )
        assert isinstance(h, AsyncPtyHandle)
        return h


class Pty:
    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def create(
        self,
        cols: int = 80,
        rows: int = 24,
        on_data: Optional[DataCallback] = None,
        *,
        cmd: Optional[Union[str, Sequence[str]]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> PtyHandle:
        """Start cmd (default an interactive bash) on a cols x rows terminal."""
        space = self._sb._space
        a = space._async_sandbox(self._sb.id).pty
        loop = space._loop()
        return PtyHandle(loop, loop.run(a.create(cols, rows, on_data, cmd=cmd, env=env, cwd=cwd, user=user,
                                                 timeout=timeout)))


"""A sandbox's file system: ``sandbox.files``.

Bodies are raw bytes (application/octet-stream); PUT replaces a file
atomically. Paths are absolute paths in the sandbox.
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import (
    IO, TYPE_CHECKING, Any, AsyncIterator, Deque, Iterator, List, Mapping, Optional, Tuple, Union,
)

import httpx

from . import _types as T
from ._errors import NotFoundError, StreamCutError, error_from_event
from ._http import Req, sandbox_path, split_lines

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox, Sandbox

__all__ = ["Files", "AsyncFiles", "FileWatch", "AsyncFileWatch"]

CHUNK = 1 << 20
METADATA_HEADER = "X-Space-Metadata-"

Data = Union[bytes, bytearray, memoryview, str, IO[bytes]]


def _q(path: str, *extra: Tuple[str, str]) -> List[Tuple[str, str]]:
    if not path.startswith("/"):
        raise ValueError("path %r: want an absolute path" % path)
    return [("path", path), *extra]


def _read_req(sid: str, path: str) -> Req:
    return Req("GET", sandbox_path(sid, "/files"), params=_q(path), sandbox=sid,
               accept="application/octet-stream", idempotent=True)


def _write_params(path: str, mode: Optional[int], mkdir: bool, owner: Optional[str]) -> List[Tuple[str, str]]:
    extra = []
    if mode is not None:
        extra.append(("mode", "%04o" % (int(mode) & 0o7777)))
    if mkdir:
        extra.append(("mkdir", "true"))
    if owner:
        extra.append(("owner", str(owner)))
    return _q(path, *extra)


def _write_req(sid: str, path: str, content: Any, mode: Optional[int], mkdir: bool,
               owner: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> Req:
    headers = {METADATA_HEADER + str(k): str(v) for k, v in (metadata or {}).items()}
    return Req("PUT", sandbox_path(sid, "/files"), params=_write_params(path, mode, mkdir, owner), content=content,
               content_type="application/octet-stream", headers=headers, sandbox=sid, idempotent=True)


def _stat_req(sid: str, path: str) -> Req:
    return Req("GET", sandbox_path(sid, "/files/stat"), params=_q(path), sandbox=sid, idempotent=True)


def _mkdir_req(sid: str, path: str, parents: bool) -> Req:
    _q(path)
    return Req("POST", sandbox_path(sid, "/files/mkdir"), json={"path": path, "parents": bool(parents)},
               sandbox=sid, expect=(200, 201), idempotent=True)


def _move_req(sid: str, src: str, dst: str) -> Req:
    _q(src)
    _q(dst)
    return Req("POST", sandbox_path(sid, "/files/move"), json={"from": src, "to": dst}, sandbox=sid)


def _watch_req(sid: str, path: str, recursive: bool) -> Req:
    extra = [("recursive", "true")] if recursive else []
    return Req("GET", sandbox_path(sid, "/files/watch"), params=_q(path, *extra), sandbox=sid,
               accept="application/x-ndjson", idempotent=True)


class _WatchLines:
    """The parsing common to FileWatch and AsyncFileWatch: NDJSON lines
    into FileEvents."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.lines: Deque[bytes] = collections.deque()
        self.ended = False

    def feed(self, chunk: bytes) -> None:
        self.lines.extend(split_lines(self.buf, chunk))

    def start(self) -> None:
        doc = json.loads(self.lines.popleft()) if self.lines else None
        if not isinstance(doc, dict) or doc.get("type") != "start":
            raise StreamCutError("file watch: no start event")

    def event(self) -> T.FileEvent:
        doc = json.loads(self.lines.popleft())
        if doc.get("type") == "error":
            self.ended = True
            raise error_from_event(doc.get("error"))
        ev = T.FileEvent.from_dict(doc)
        if ev.name == "." and ev.type in ("remove", "rename"):
            self.ended = True  # the watched directory went: nothing more comes
        return ev


class FileWatch:
    """The changes below a watched directory (``files.watch``), as
    ``types.FileEvent``: iterate over it; it ends after the directory's own
    remove or rename event (name "."). ``close()`` (or the end of a
    ``with`` block) ends the watch. An ``overflow`` event stands in for
    events lost while the reader was too slow; a stream cut short raises
    StreamCutError."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._chunks = resp.iter_bytes()
        self._p = _WatchLines()
        try:
            self._fill()
            self._p.start()
        except BaseException:
            self.close()
            raise

    def _fill(self) -> None:
        while not self._p.lines:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                raise StreamCutError("file watch stream ended") from None
            except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
                raise StreamCutError("file watch stream cut: %s" % exc) from None
            self._p.feed(chunk)

    def __iter__(self) -> "FileWatch":
        return self

    def __next__(self) -> T.FileEvent:
        if self._p.ended:
            self.close()
            raise StopIteration
        try:
            self._fill()
            return self._p.event()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._p.ended = True
        self._resp.close()

    def __enter__(self) -> "FileWatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncFileWatch:
    """``FileWatch`` of the async API: ``async for ev in watch``; ``await
    watch.close()`` or ``async with``."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self._chunks = resp.aiter_bytes()
        self._p = _WatchLines()

    async def _start(self) -> "AsyncFileWatch":
        try:
            await self._fill()
            self._p.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def _fill(self) -> None:
        while not self._p.lines:
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                raise StreamCutError("file watch stream ended") from None
            except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
                raise StreamCutError("file watch stream cut: %s" % exc) from None
            self._p.feed(chunk)

    def __aiter__(self) -> "AsyncFileWatch":
        return self

    async def __anext__(self) -> T.FileEvent:
        if self._p.ended:
            await self.close()
            raise StopAsyncIteration
        try:
            await self._fill()
            return self._p.event()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._p.ended = True
        await self._resp.aclose()

    async def __aenter__(self) -> "AsyncFileWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


def _list_req(sid: str, path: str) -> Req:
    return Req("GET", sandbox_path(sid, "/files/list"), params=_q(path), sandbox=sid, idempotent=True)


def _remove_req(sid: str, path: str, recursive: bool) -> Req:
    extra = [("recursive", "true")] if recursive else []
    return Req("DELETE", sandbox_path(sid, "/files"), params=_q(path, *extra), sandbox=sid,
               expect=(204, 200), idempotent=True)


def _tar_req(sid: str, path: str, content: Optional[bytes] = None, mkdir: bool = False) -> Req:
    if content is None:
        return Req("GET", sandbox_path(sid, "/files/tar"), params=_q(path), sandbox=sid,
                   accept="application/x-tar", idempotent=True)
    extra = [("mkdir", "true")] if mkdir else []
    return Req("PUT", sandbox_path(sid, "/files/tar"), params=_q(path, *extra), content=content,
               content_type="application/x-tar", sandbox=sid, idempotent=True)


def _body(data: Data) -> Union[bytes, IO[bytes]]:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return data
    raise TypeError("data: bytes, str or a binary file-like object, not %s" % type(data).__name__)


def _iter_file(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        b = f.read(CHUNK)
        if not b:
            return
        if isinstance(b, str):
            raise TypeError("write: the file-like object must be opened in binary mode")
        yield b


async def _aiter_file(f: IO[bytes]) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    while True:
        b = await loop.run_in_executor(None, f.read, CHUNK)
        if not b:
            return
        if isinstance(b, str):
            raise TypeError("write: the file-like object must be opened in binary mode")
        yield b


class Files:
    """``sandbox.files`` of the sync API."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox
        self._http = sandbox._space._http

    def read(self, path: str) -> bytes:
        """The file's bytes."""
        return self._http.send(_read_req(self._sb.id, path)).content

    def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read(path).decode(encoding, errors)

    def read_to(self, path: str, dest: IO[bytes]) -> int:
        """Stream the file into dest (a binary file-like object); returns the byte count."""
        n = 0
        with self._http.stream(_read_req(self._sb.id, path)) as resp:
            for chunk in resp.iter_bytes():
                dest.write(chunk)
                n += len(chunk)
        return n

    def iter_read(self, path: str) -> Iterator[bytes]:
        """The file's bytes, in chunks as they arrive."""
        with self._http.stream(_read_req(self._sb.id, path)) as resp:
            yield from resp.iter_bytes()

    def write(self, path: str, data: Data, mode: Optional[int] = None, mkdir: bool = True,
              owner: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> T.FileWritten:
        """Create or replace the file (atomically) with data: bytes, str
        (UTF-8) or a binary file-like object, streamed. mode: permission
        bits (e.g. 0o755; default 0o644). mkdir: create missing parents.
        owner: the user who owns it (a name in the sandbox, or a uid;
        default root). metadata: set as the file's user extended
        attributes (keys of letters, digits, '.', '_', '-', kept in lower
        case; values up to 4 KiB; at most 32); a file system without them
        (the sandbox's /tmp) raises FailedPreconditionError."""
        body = _body(data)
        content = body if isinstance(body, bytes) else _iter_file(body)
        return T.FileWritten.from_dict(self._http.json(
            _write_req(self._sb.id, path, content, mode, mkdir, owner, metadata)))

    def list(self, path: str) -> List[T.FileInfo]:
        return T.FileList.from_dict(self._http.json(_list_req(self._sb.id, path))).entries

    def stat(self, path: str) -> T.FileInfo:
        """The file's description (a symlink's own, with its target)."""
        return T.FileInfo.from_dict(self._http.json(_stat_req(self._sb.id, path)))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFoundError:
            return False

    def remove(self, path: str, recursive: bool = False) -> None:
        self._http.send(_remove_req(self._sb.id, path, recursive))

    def make_dir(self, path: str, parents: bool = True) -> bool:
        """Create a directory; False when it was one already (another kind
        of file in its place raises ConflictError)."""
        return self._http.send(_mkdir_req(self._sb.id, path, parents)).status_code == 201

    def move(self, src: str, dst: str) -> T.FileInfo:
        """Rename src to dst (making dst's missing parents); dst's description."""
        return T.FileInfo.from_dict(self._http.json(_move_req(self._sb.id, src, dst)))

    def watch(self, path: str, recursive: bool = False) -> FileWatch:
        """Watch the directory (with recursive, the ones below it too,
        including new ones): returns once it is watched, an iterator of
        ``types.FileEvent`` for every change after. A missing path raises
        NotFoundError, a file InvalidArgumentError. Close it when done
        (or use ``with``)."""
        return FileWatch(self._http.send(_watch_req(self._sb.id, path, recursive), stream=True))

    def read_tar(self, path: str) -> bytes:
        """The directory as a tar archive, as the sandbox sent it: owners,
        setuid bits, fifos, devices and links included. To unpack it on
        the host, treat it as hostile: ``tarfile`` with ``filter="data"``
        (Python 3.12, 3.9.17+) drops owners, setuid/setgid/sticky bits and
        group/other write, and refuses special files and names or links
        that leave the directory."""
        return self._http.send(_tar_req(self._sb.id, path)).content

    def write_tar(self, path: str, archive: bytes, mkdir: bool = True) -> T.TarWritten:
        """Unpack a tar archive into the directory (all or nothing)."""
        return T.TarWritten.from_dict(self._http.json(_tar_req(self._sb.id, path, bytes(archive), mkdir)))


class AsyncFiles:
    """``sandbox.files`` of the async API."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox
        self._http = sandbox._space._http

    async def read(self, path: str) -> bytes:
        return (await self._http.send(_read_req(self._sb.id, path))).content

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (await self.read(path)).decode(encoding, errors)

    async def read_to(self, path: str, dest: IO[bytes]) -> int:
        n = 0
        async with self._http.stream(_read_req(self._sb.id, path)) as resp:
            async for chunk in resp.aiter_bytes():
                dest.write(chunk)
                n += len(chunk)
        return n

    async def iter_read(self, path: str) -> AsyncIterator[bytes]:
        async with self._http.stream(_read_req(self._sb.id, path)) as resp:
            async for chunk in resp.aiter_bytes():
                yield chunk

    async def write(self, path: str, data: Data, mode: Optional[int] = None, mkdir: bool = True,
                    owner: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None) -> T.FileWritten:
        body = _body(data)
        content = body if isinstance(body, bytes) else _aiter_file(body)
        return T.FileWritten.from_dict(await self._http.json(
            _write_req(self._sb.id, path, content, mode, mkdir, owner, metadata)))

    async def list(self, path: str) -> List[T.FileInfo]:
        return T.FileList.from_dict(await self._http.json(_list_req(self._sb.id, path))).entries

    async def stat(self, path: str) -> T.FileInfo:
        return T.FileInfo.from_dict(await self._http.json(_stat_req(self._sb.id, path)))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except NotFoundError:
            return False

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._http.send(_remove_req(self._sb.id, path, recursive))

    async def make_dir(self, path: str, parents: bool = True) -> bool:
        return (await self._http.send(_mkdir_req(self._sb.id, path, parents))).status_code == 201

    async def move(self, src: str, dst: str) -> T.FileInfo:
        return T.FileInfo.from_dict(await self._http.json(_move_req(self._sb.id, src, dst)))

    async def watch(self, path: str, recursive: bool = False) -> AsyncFileWatch:
        """``async for ev in await sb.files.watch(path)``: as Files.watch."""
        resp = await self._http.send(_watch_req(self._sb.id, path, recursive), stream=True)
        return await AsyncFileWatch(resp)._start()

    async def read_tar(self, path: str) -> bytes:
        return (await self._http.send(_tar_req(self._sb.id, path))).content

    async def write_tar(self, path: str, archive: bytes, mkdir: bool = True) -> T.TarWritten:
        return T.TarWritten.from_dict(await self._http.json(_tar_req(self._sb.id, path, bytes(archive), mkdir)))

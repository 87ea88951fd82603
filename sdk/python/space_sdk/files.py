"""A sandbox's file system: ``sandbox.files``.

Bodies are raw bytes (application/octet-stream); PUT replaces a file
atomically. Paths are absolute paths in the sandbox.
"""

from __future__ import annotations

import asyncio
import posixpath
from typing import IO, TYPE_CHECKING, Any, AsyncIterator, Iterator, List, Optional, Tuple, Union

from . import _types as T
from ._errors import NotFoundError
from ._http import Req, sandbox_path

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox, Sandbox

__all__ = ["Files", "AsyncFiles"]

CHUNK = 1 << 20
# An empty tar archive: PUT files/tar with it makes a directory.
EMPTY_TAR = b"\0" * 1024

Data = Union[bytes, bytearray, memoryview, str, IO[bytes]]


def _q(path: str, *extra: Tuple[str, str]) -> List[Tuple[str, str]]:
    if not path.startswith("/"):
        raise ValueError("path %r: want an absolute path" % path)
    return [("path", path), *extra]


def _read_req(sid: str, path: str) -> Req:
    return Req("GET", sandbox_path(sid, "/files"), params=_q(path), sandbox=sid,
               accept="application/octet-stream", idempotent=True)


def _write_params(path: str, mode: Optional[int], mkdir: bool) -> List[Tuple[str, str]]:
    extra = []
    if mode is not None:
        extra.append(("mode", "%04o" % (int(mode) & 0o7777)))
    if mkdir:
        extra.append(("mkdir", "true"))
    return _q(path, *extra)


def _write_req(sid: str, path: str, content: Any, mode: Optional[int], mkdir: bool) -> Req:
    return Req("PUT", sandbox_path(sid, "/files"), params=_write_params(path, mode, mkdir), content=content,
               content_type="application/octet-stream", sandbox=sid, idempotent=True)


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


def _split(path: str) -> Tuple[str, str]:
    p = path.rstrip("/") or "/"
    return posixpath.dirname(p) or "/", posixpath.basename(p)


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

    def write(self, path: str, data: Data, mode: Optional[int] = None, mkdir: bool = True) -> T.FileWritten:
        """Create or replace the file (atomically) with data: bytes, str
        (UTF-8) or a binary file-like object, streamed. mode: permission
        bits (e.g. 0o755; default 0o644). mkdir: create missing parents."""
        body = _body(data)
        content = body if isinstance(body, bytes) else _iter_file(body)
        return T.FileWritten.from_dict(self._http.json(_write_req(self._sb.id, path, content, mode, mkdir)))

    def list(self, path: str) -> List[T.FileInfo]:
        return T.FileList.from_dict(self._http.json(_list_req(self._sb.id, path))).entries

    def exists(self, path: str) -> bool:
        parent, name = _split(path)
        try:
            return name == "" or any(e.name == name for e in self.list(parent))
        except NotFoundError:
            return False

    def remove(self, path: str, recursive: bool = False) -> None:
        self._http.send(_remove_req(self._sb.id, path, recursive))

    def make_dir(self, path: str, parents: bool = True) -> None:
        """Create a directory (no error when it exists)."""
        self._http.json(_tar_req(self._sb.id, path, EMPTY_TAR, parents))

    def read_tar(self, path: str) -> bytes:
        """The directory as a tar archive."""
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

    async def write(self, path: str, data: Data, mode: Optional[int] = None, mkdir: bool = True) -> T.FileWritten:
        body = _body(data)
        content = body if isinstance(body, bytes) else _aiter_file(body)
        return T.FileWritten.from_dict(await self._http.json(_write_req(self._sb.id, path, content, mode, mkdir)))

    async def list(self, path: str) -> List[T.FileInfo]:
        return T.FileList.from_dict(await self._http.json(_list_req(self._sb.id, path))).entries

    async def exists(self, path: str) -> bool:
        parent, name = _split(path)
        try:
            return name == "" or any(e.name == name for e in await self.list(parent))
        except NotFoundError:
            return False

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._http.send(_remove_req(self._sb.id, path, recursive))

    async def make_dir(self, path: str, parents: bool = True) -> None:
        await self._http.json(_tar_req(self._sb.id, path, EMPTY_TAR, parents))

    async def read_tar(self, path: str) -> bytes:
        return (await self._http.send(_tar_req(self._sb.id, path))).content

    async def write_tar(self, path: str, archive: bytes, mkdir: bool = True) -> T.TarWritten:
        return T.TarWritten.from_dict(await self._http.json(_tar_req(self._sb.id, path, bytes(archive), mkdir)))

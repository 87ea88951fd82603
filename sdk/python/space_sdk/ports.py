"""Exposed ports: ``sandbox.ports`` reaches a TCP port of the sandbox.

``request`` sends an HTTP request to a server in the sandbox through
``/v1/sandboxes/{id}/ports/{port}/http/{path}`` (the sandbox's gateway,
with the API key) and returns the guest server's answer as it sent it,
whatever its status. SPACE's own refusals (no such sandbox, no network,
nothing listening on the port) raise their :class:`SpaceError`: the
server marks every answer of the guest with a ``Space-Port`` header.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Tuple, Union

import httpx

from . import _types as T
from ._errors import error_from_response
from ._http import Req, sandbox_path

if TYPE_CHECKING:
    from .sandbox import AsyncSandbox, Sandbox

__all__ = ["Ports", "AsyncPorts"]

GUEST_HEADER = "Space-Port"
_ANY_STATUS = tuple(range(100, 600))
_POLL = 0.2  # seconds between probes in wait_open


def _probe_req(sandbox_id: str, port: int) -> Req:
    return Req("GET", sandbox_path(sandbox_id, "/ports/%d" % _port(port)), sandbox=sandbox_id, idempotent=True)


def _port(port: int) -> int:
    p = int(port)
    if not 1 <= p <= 65535:
        raise ValueError("port %d: want 1-65535" % p)
    return p


def _http_req(
    sandbox_id: str,
    port: int,
    path: str,
    method: str,
    params: Optional[Sequence[Tuple[str, str]]],
    headers: Optional[Mapping[str, str]],
    content: Optional[Union[bytes, str]],
    json: Any,
) -> Req:
    if isinstance(content, str):
        content = content.encode()
    hdrs = dict(headers or {})
    ctype = next((v for k, v in hdrs.items() if k.lower() == "content-type"), None)
    return Req(
        method.upper(),
        sandbox_path(sandbox_id, "/ports/%d/http/%s" % (_port(port), path.lstrip("/"))),
        params=tuple(params or ()),
        json=json,
        content=content,
        content_type=ctype,
        headers=hdrs,
        expect=_ANY_STATUS,
        sandbox=sandbox_id,
        idempotent=method.upper() in ("GET", "HEAD", "PUT", "DELETE"),
        accept=next((v for k, v in hdrs.items() if k.lower() == "accept"), "*/*"),
    )


def _guest_answer(resp: httpx.Response) -> httpx.Response:
    """resp if the guest's server sent it, else SPACE's error raised."""
    if GUEST_HEADER in resp.headers or resp.status_code < 400:
        return resp
    raise error_from_response(resp.status_code, resp.content)


class Ports:
    """``sandbox.ports`` of the sync API."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def is_open(self, port: int) -> bool:
        """Whether something in the sandbox accepts TCP connections on port."""
        doc = self._sb._space._http.json(_probe_req(self._sb.id, port))
        return bool(T.PortState.from_dict(doc).open)

    def wait_open(self, port: int, timeout: float = 60.0) -> None:
        """Wait until port accepts connections; TimeoutError after timeout seconds."""
        deadline = time.monotonic() + timeout
        while not self.is_open(port):
            if time.monotonic() >= deadline:
                raise TimeoutError("port %d of %s did not open within %gs" % (port, self._sb.id, timeout))
            time.sleep(_POLL)

    def request(
        self,
        port: int,
        path: str = "/",
        method: str = "GET",
        *,
        params: Optional[Sequence[Tuple[str, str]]] = None,
        headers: Optional[Mapping[str, str]] = None,
        content: Optional[Union[bytes, str]] = None,
        json: Any = None,
    ) -> httpx.Response:
        """Send an HTTP request to http://SANDBOX:port/path; the guest's answer, any status."""
        req = _http_req(self._sb.id, port, path, method, params, headers, content, json)
        return _guest_answer(self._sb._space._http.send(req))

    def get(self, port: int, path: str = "/", **kw: Any) -> httpx.Response:
        return self.request(port, path, "GET", **kw)

    def post(self, port: int, path: str = "/", **kw: Any) -> httpx.Response:
        return self.request(port, path, "POST", **kw)


class AsyncPorts:
    """``sandbox.ports`` of the async API."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def is_open(self, port: int) -> bool:
        doc = await self._sb._space._http.json(_probe_req(self._sb.id, port))
        return bool(T.PortState.from_dict(doc).open)

    async def wait_open(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not await self.is_open(port):
            if time.monotonic() >= deadline:
                raise TimeoutError("port %d of %s did not open within %gs" % (port, self._sb.id, timeout))
            await asyncio.sleep(_POLL)

    async def request(
        self,
        port: int,
        path: str = "/",
        method: str = "GET",
        *,
        params: Optional[Sequence[Tuple[str, str]]] = None,
        headers: Optional[Mapping[str, str]] = None,
        content: Optional[Union[bytes, str]] = None,
        json: Any = None,
    ) -> httpx.Response:
        req = _http_req(self._sb.id, port, path, method, params, headers, content, json)
        return _guest_answer(await self._sb._space._http.send(req))

    async def get(self, port: int, path: str = "/", **kw: Any) -> httpx.Response:
        return await self.request(port, path, "GET", **kw)

    async def post(self, port: int, path: str = "/", **kw: Any) -> httpx.Response:
        return await self.request(port, path, "POST", **kw)

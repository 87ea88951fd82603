"""HTTP plumbing shared by the sync and async clients.

A call is described once as a :class:`Req` (sans-IO); :class:`SyncHTTP`
and :class:`AsyncHTTP` send it with httpx. Both route a sandbox's
data-plane requests (exec, processes, files, ports) to the data plane
its Sandbox reply names, with that plane's token, and fetch a new token
once when the data plane answers 401 (as client/client.go does); both
retry 429 and 503 with backoff, for idempotent requests only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import (
    Any,
    AsyncIterator,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from ._errors import SpaceError, error_from_response

__all__ = ["Req", "Config", "SyncHTTP", "AsyncHTTP", "Router", "sandbox_path"]

USER_AGENT = "space-sdk-python/0.1.0"
DEFAULT_URL = "http://127.0.0.1:7070"

# A data-plane token is replaced this long before it expires; a sandbox
# that names no data plane is asked again after NO_PLANE_FOR.
PLANE_MARGIN = 30.0
NO_PLANE_FOR = 30.0
MAX_ERROR_BODY = 64 << 10

Params = Sequence[Tuple[str, str]]
Body = Union[bytes, Iterator[bytes], AsyncIterator[bytes], None]


def sandbox_path(sandbox_id: str, rest: str = "") -> str:
    return "/v1/sandboxes/" + quote(sandbox_id, safe="") + rest


def escape(segment: str) -> str:
    return quote(segment, safe="")


@dataclass
class Req:
    """One API call."""

    method: str
    path: str
    params: Params = ()
    json: Any = None
    content: Body = None
    content_type: Optional[str] = None
    headers: Mapping[str, str] = field(default_factory=dict)
    expect: Tuple[int, ...] = (200,)
    sandbox: Optional[str] = None  # a data-plane request of this sandbox
    idempotent: bool = False  # 429/503 may be retried
    accept: str = "application/json"

    @property
    def replayable(self) -> bool:
        return self.content is None or isinstance(self.content, bytes)


@dataclass
class Config:
    api_url: str
    api_key: str
    timeout: float = 300.0  # per request (not per stream: streams have no read deadline)
    max_retries: int = 4

    @classmethod
    def make(
        cls, api_url: Optional[str], api_key: Optional[str], timeout: Optional[float], max_retries: Optional[int]
    ) -> "Config":
        url = (api_url or os.environ.get("SPACE_API_URL") or DEFAULT_URL).rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("api_url %r: want http(s)://host[:port][/prefix]" % url)
        key = api_key if api_key is not None else os.environ.get("SPACE_API_KEY", "")
        return cls(
            urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", "")),
            key,
            300.0 if timeout is None else timeout,
            4 if max_retries is None else max_retries,
        )


_FRAC = re.compile(r"\.(\d+)")


def parse_time(s: str) -> float:
    """An RFC 3339 time (nanoseconds allowed) as a POSIX timestamp."""
    s = s.strip().replace("Z", "+00:00").replace("z", "+00:00")
    s = _FRAC.sub(lambda m: "." + (m.group(1) + "000000")[:6], s, count=1)
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


@dataclass
class _Plane:
    base: Optional[str]  # None: through the API server with the API key
    token: str
    expires: float


class Router:
    """Where each sandbox's data-plane requests go (thread-safe)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._planes: Dict[str, _Plane] = {}

    def lookup(self, sandbox: str) -> Optional[Tuple[str, str]]:
        """(base URL, credential), or None when the sandbox must be fetched first."""
        with self._lock:
            p = self._planes.get(sandbox)
        if p is None or time.time() + PLANE_MARGIN >= p.expires:
            return None
        return (p.base, p.token) if p.base else (self.cfg.api_url, self.cfg.api_key)

    def after_fetch(self, sandbox: str) -> Tuple[str, str]:
        """The route once the sandbox was fetched (or failed to be)."""
        with self._lock:
            if sandbox not in self._planes:
                self._planes[sandbox] = _Plane(None, "", time.time() + PLANE_MARGIN + NO_PLANE_FOR)
            p = self._planes[sandbox]
        return (p.base, p.token) if p.base else (self.cfg.api_url, self.cfg.api_key)

    def remember(self, sb: Mapping[str, Any]) -> None:
        """Keep the data plane a Sandbox reply names (or forget one it lost)."""
        sid = sb.get("id")
        if not sid:
            return
        dp = sb.get("data_plane") or {}
        url, token = str(dp.get("url") or ""), str(dp.get("token") or "")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc or not token:
            self.forget(sid)
            return
        try:
            expires = parse_time(str(dp.get("expires_at", "")))
        except ValueError:
            self.forget(sid)
            return
        base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        with self._lock:
            self._planes[sid] = _Plane(base, token, expires)

    def remember_reply(self, doc: Any) -> None:
        if isinstance(doc, dict):
            if "sandboxes" in doc and isinstance(doc["sandboxes"], list):
                for sb in doc["sandboxes"]:
                    if isinstance(sb, dict):
                        self.remember(sb)
            elif "id" in doc and "team" in doc and "state" in doc:
                self.remember(doc)

    def forget(self, sandbox: str) -> None:
        with self._lock:
            self._planes.pop(sandbox, None)


def retry_delay(attempt: int, headers: Optional[httpx.Headers]) -> float:
    """How long to wait before retry number attempt (0-based)."""
    if headers is not None:
        ra = headers.get("Retry-After")
        if ra:
            try:
                return min(max(float(ra), 0.0), 30.0)
            except ValueError:
                pass
    return min(0.25 * (2**attempt), 8.0) * (0.5 + random.random() / 2)


RETRY_STATUSES = (429, 503)


def _headers(req: Req, auth: str) -> Dict[str, str]:
    h = {"User-Agent": USER_AGENT, "Accept": req.accept}
    if auth:
        h["Authorization"] = "Bearer " + auth
    if req.content is not None:
        h["Content-Type"] = req.content_type or "application/octet-stream"
    h.update(req.headers)
    return h


def _build(
    client: Union[httpx.Client, httpx.AsyncClient], req: Req, base: str, auth: str, timeout: Any
) -> httpx.Request:
    return client.build_request(
        req.method,
        base + req.path,
        params=list(req.params),
        json=req.json,
        content=req.content,  # type: ignore[arg-type]
        headers=_headers(req, auth),
        timeout=timeout,
    )


def _stream_timeout(cfg: Config) -> httpx.Timeout:
    return httpx.Timeout(connect=min(cfg.timeout, 30.0), read=None, write=None, pool=None)


class SyncHTTP:
    def __init__(self, cfg: Config, router: Optional[Router] = None, client: Optional[httpx.Client] = None) -> None:
        self.cfg = cfg
        self.router = router or Router(cfg)
        self.client = client or httpx.Client(timeout=httpx.Timeout(cfg.timeout, connect=min(cfg.timeout, 30.0)))

    def close(self) -> None:
        self.client.close()

    def route(self, sandbox: Optional[str]) -> Tuple[str, str]:
        if not sandbox:
            return self.cfg.api_url, self.cfg.api_key
        r = self.router.lookup(sandbox)
        if r is not None:
            return r
        try:
            self.json(Req("GET", sandbox_path(sandbox), idempotent=True))
        except (SpaceError, httpx.TransportError):
            pass  # the request itself gets the server's answer
        return self.router.after_fetch(sandbox)

    def _send_once(self, req: Req, stream: bool) -> httpx.Response:
        base, auth = self.route(req.sandbox)
        timeout = _stream_timeout(self.cfg) if stream else httpx.USE_CLIENT_DEFAULT
        resp = self.client.send(_build(self.client, req, base, auth, timeout), stream=stream)
        if resp.status_code == 401 and req.sandbox and req.replayable and auth != self.cfg.api_key:
            resp.close()
            self.router.forget(req.sandbox)  # a data-plane token refused: once more with a new one
            base, auth = self.route(req.sandbox)
            resp = self.client.send(_build(self.client, req, base, auth, timeout), stream=stream)
        return resp

    def send(self, req: Req, stream: bool = False) -> httpx.Response:
        """Send req; a reply with a status outside req.expect raises its SpaceError.
        With stream the caller closes the reply."""
        attempt = 0
        while True:
            try:
                resp = self._send_once(req, stream)
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if not (req.idempotent and req.replayable) or attempt >= self.cfg.max_retries:
                    raise
                time.sleep(retry_delay(attempt, None))
                attempt += 1
                continue
            if resp.status_code in req.expect:
                return resp
            body = _read_error_sync(resp)
            if (
                resp.status_code in RETRY_STATUSES
                and req.idempotent
                and req.replayable
                and attempt < self.cfg.max_retries
            ):
                time.sleep(retry_delay(attempt, resp.headers))
                attempt += 1
                continue
            raise error_from_response(resp.status_code, body)

    def json(self, req: Req) -> Any:
        resp = self.send(req)
        if not resp.content:
            return None
        doc = resp.json()
        self.router.remember_reply(doc)
        return doc

    @contextlib.contextmanager
    def stream(self, req: Req) -> Iterator[httpx.Response]:
        resp = self.send(req, stream=True)
        try:
            yield resp
        finally:
            resp.close()


def _read_error_sync(resp: httpx.Response) -> bytes:
    try:
        buf = b""
        for chunk in resp.iter_bytes():
            buf += chunk
            if len(buf) >= MAX_ERROR_BODY:
                break
        return buf[:MAX_ERROR_BODY]
    except (httpx.HTTPError, RuntimeError):
        return b""
    finally:
        resp.close()


async def _read_error_async(resp: httpx.Response) -> bytes:
    try:
        buf = b""
        async for chunk in resp.aiter_bytes():
            buf += chunk
            if len(buf) >= MAX_ERROR_BODY:
                break
        return buf[:MAX_ERROR_BODY]
    except (httpx.HTTPError, RuntimeError):
        return b""
    finally:
        await resp.aclose()


class AsyncHTTP:
    def __init__(
        self, cfg: Config, router: Optional[Router] = None, client: Optional[httpx.AsyncClient] = None
    ) -> None:
        self.cfg = cfg
        self.router = router or Router(cfg)
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(cfg.timeout, connect=min(cfg.timeout, 30.0))
        )
        self.sessions: Set[Any] = set()  # open WebSocket sessions (AsyncCommandHandle)

    async def aclose(self) -> None:
        for h in list(self.sessions):
            await h._drop()
        await self.client.aclose()

    async def route(self, sandbox: Optional[str]) -> Tuple[str, str]:
        if not sandbox:
            return self.cfg.api_url, self.cfg.api_key
        r = self.router.lookup(sandbox)
        if r is not None:
            return r
        try:
            await self.json(Req("GET", sandbox_path(sandbox), idempotent=True))
        except (SpaceError, httpx.TransportError):
            pass
        return self.router.after_fetch(sandbox)

    async def _send_once(self, req: Req, stream: bool) -> httpx.Response:
        base, auth = await self.route(req.sandbox)
        timeout = _stream_timeout(self.cfg) if stream else httpx.USE_CLIENT_DEFAULT
        resp = await self.client.send(_build(self.client, req, base, auth, timeout), stream=True)
        if resp.status_code == 401 and req.sandbox and req.replayable and auth != self.cfg.api_key:
            await resp.aclose()
            self.router.forget(req.sandbox)
            base, auth = await self.route(req.sandbox)
            resp = await self.client.send(_build(self.client, req, base, auth, timeout), stream=True)
        return resp

    async def send(self, req: Req, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            try:
                resp = await self._send_once(req, stream)
                if not stream and resp.status_code in req.expect:
                    try:
                        await resp.aread()
                    finally:
                        await resp.aclose()
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if not (req.idempotent and req.replayable) or attempt >= self.cfg.max_retries:
                    raise
                await asyncio.sleep(retry_delay(attempt, None))
                attempt += 1
                continue
            if resp.status_code in req.expect:
                return resp
            body = await _read_error_async(resp)
            if (
                resp.status_code in RETRY_STATUSES
                and req.idempotent
                and req.replayable
                and attempt < self.cfg.max_retries
            ):
                await asyncio.sleep(retry_delay(attempt, resp.headers))
                attempt += 1
                continue
            raise error_from_response(resp.status_code, body)

    async def json(self, req: Req) -> Any:
        resp = await self.send(req)
        if not resp.content:
            return None
        doc = resp.json()
        self.router.remember_reply(doc)
        return doc

    @contextlib.asynccontextmanager
    async def stream(self, req: Req) -> AsyncIterator[httpx.Response]:
        resp = await self.send(req, stream=True)
        try:
            yield resp
        finally:
            await resp.aclose()


def split_lines(buf: bytearray, chunk: bytes) -> List[bytes]:
    """Append chunk to buf and take the complete lines out of it."""
    buf += chunk
    if b"\n" not in chunk:
        return []
    *lines, rest = bytes(buf).split(b"\n")
    buf[:] = rest
    return [ln for ln in lines if ln.strip()]

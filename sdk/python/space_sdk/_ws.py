"""WebSocket plumbing (exec/ws and attach) over the ``websockets`` package.

Works with websockets 10.4 (the legacy client, ``extra_headers``) up to
the newest (the asyncio client of 13+, ``additional_headers``). The sync
API runs these coroutines on a private event loop thread
(:class:`LoopThread`): websockets only gained a sync client in 11.0.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from typing import Any, Awaitable, Coroutine, Dict, Optional, TypeVar, Union

from ._errors import SpaceError, error_from_response
from ._http import AsyncHTTP

try:  # websockets >= 13
    from websockets.asyncio.client import connect as _connect_new
except ImportError:  # pragma: no cover - depends on the installed version
    _connect_new = None  # type: ignore[assignment]
import websockets

T = TypeVar("T")

# Binary message stream bytes (api.StreamStdin/Stdout/Stderr).
STDIN, STDOUT, STDERR = 0, 1, 2
MAX_MESSAGE = 64 << 20

Message = Union[str, bytes]


class WSConn:
    """A connected WebSocket, whichever websockets version made it."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws

    async def send(self, msg: Message) -> None:
        await self._ws.send(msg)

    async def send_json(self, doc: Dict[str, Any]) -> None:
        await self._ws.send(json.dumps(doc, separators=(",", ":")))

    async def recv(self) -> Message:
        return await self._ws.recv()  # type: ignore[no-any-return]

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self._ws.close(), 5)
        except Exception:  # noqa: BLE001 - closing a broken socket
            pass


def _ws_url(base: str, path: str) -> str:
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + path
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :] + path
    return base + path


def _handshake_status(exc: BaseException) -> Optional[int]:
    resp = getattr(exc, "response", None)  # websockets >= 13: InvalidStatus
    if resp is not None and hasattr(resp, "status_code"):
        return int(resp.status_code)
    code = getattr(exc, "status_code", None)  # legacy: InvalidStatusCode
    return int(code) if code is not None else None


def _handshake_body(exc: BaseException) -> bytes:
    resp = getattr(exc, "response", None)
    body = getattr(resp, "body", None)
    return bytes(body) if body else b""


async def _open(url: str, token: str, open_timeout: float) -> Any:
    headers = {"Authorization": "Bearer " + token} if token else {}
    common: Dict[str, Any] = dict(
        compression=None,  # output is often incompressible; the server does not need it
        max_size=MAX_MESSAGE,
        open_timeout=open_timeout,
        ping_interval=30,
        ping_timeout=None,  # a busy guest must not cut a long command
    )
    if _connect_new is not None:
        return await _connect_new(url, additional_headers=headers, **common)
    return await websockets.connect(url, extra_headers=headers, **common)  # type: ignore[attr-defined]


async def ws_connect(http: AsyncHTTP, sandbox: str, path: str) -> WSConn:
    """Open a WebSocket to a sandbox's data-plane route, fetching a new
    data-plane token once when the data plane refuses the one it has."""
    for attempt in range(2):
        base, auth = await http.route(sandbox)
        try:
            return WSConn(await _open(_ws_url(base, path), auth, min(http.cfg.timeout, 60.0)))
        except (websockets.exceptions.InvalidHandshake, OSError, asyncio.TimeoutError) as exc:
            status = _handshake_status(exc)
            if status is None:
                raise
            if status == 401 and attempt == 0 and auth != http.cfg.api_key:
                http.router.forget(sandbox)
                continue
            raise error_from_response(status, _handshake_body(exc)) from None
    raise SpaceError("internal", "unreachable")  # pragma: no cover


class LoopThread:
    """A private asyncio loop on a daemon thread, for the sync API's WebSockets."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="space-sdk-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync space_sdk call from an output callback would deadlock; use the handle later")
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError("timed out after %s s" % timeout) from None

    def close(self, final: Optional[Awaitable[Any]] = None) -> None:
        if not self.loop.is_running():
            return

        async def _stop() -> None:
            if final is not None:
                await final

        try:
            self.submit(_stop()).result(10)
        except Exception:  # noqa: BLE001
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

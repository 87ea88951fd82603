"""The entry points: :class:`Space` (sync) and :class:`AsyncSpace` (asyncio)."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Optional, Type

import httpx

from . import _types as T
from ._http import AsyncHTTP, Config, Req, Router, SyncHTTP
from ._ws import LoopThread
from .sandbox import AsyncSandbox, AsyncSandboxes, Sandboxes
from .templates import (
    APIKeys,
    AsyncAPIKeys,
    AsyncQuotas,
    AsyncSecrets,
    AsyncSnapshots,
    AsyncTemplates,
    Quotas,
    Secrets,
    Snapshots,
    Templates,
)

__all__ = ["Space", "AsyncSpace"]


class AsyncSpace:
    """A client of one SPACE server for asyncio code.

    api_url and api_key default to $SPACE_API_URL (else
    http://127.0.0.1:7070) and $SPACE_API_KEY. timeout bounds each
    ordinary request (not output streams); max_retries bounds the retries
    of idempotent requests answered 429 or 503.
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
        http_client: Optional[httpx.AsyncClient] = None,
        _router: Optional[Router] = None,
    ) -> None:
        cfg = _router.cfg if _router else Config.make(api_url, api_key, timeout, max_retries)
        self._http = AsyncHTTP(cfg, _router, http_client)
        self.sandboxes = AsyncSandboxes(self)
        self.templates = AsyncTemplates(self)
        self.snapshots = AsyncSnapshots(self)
        self.api_keys = AsyncAPIKeys(self)
        self.secrets = AsyncSecrets(self)
        self.quota = AsyncQuotas(self)

    @property
    def api_url(self) -> str:
        return self._http.cfg.api_url

    async def health(self) -> T.Health:
        return T.Health.from_dict(await self._http.json(Req("GET", "/v1/health", idempotent=True)))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncSpace":
        return self

    async def __aexit__(
        self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        await self.aclose()


class Space:
    """A client of one SPACE server (blocking calls); see AsyncSpace for the arguments.

    HTTP calls run on the calling thread (httpx.Client). WebSocket
    sessions (background commands, attach, PTY) run on a private event
    loop thread started on first use; their output callbacks run there.
    """

    def __init__(
        self,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        max_retries: Optional[int] = None,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        cfg = Config.make(api_url, api_key, timeout, max_retries)
        self._router = Router(cfg)
        self._http = SyncHTTP(cfg, self._router, http_client)
        self._lock = threading.Lock()
        self._lt: Optional[LoopThread] = None
        self._aspace: Optional[AsyncSpace] = None
        self.sandboxes = Sandboxes(self)
        self.templates = Templates(self)
        self.snapshots = Snapshots(self)
        self.api_keys = APIKeys(self)
        self.secrets = Secrets(self)
        self.quota = Quotas(self)

    @property
    def api_url(self) -> str:
        return self._http.cfg.api_url

    def _loop(self) -> LoopThread:
        with self._lock:
            if self._lt is None:
                self._lt = LoopThread()
                self._aspace = AsyncSpace(_router=self._router)
            return self._lt

    def _async_sandbox(self, sandbox_id: str) -> AsyncSandbox:
        self._loop()
        assert self._aspace is not None
        return AsyncSandbox(self._aspace, sandbox_id)

    def health(self) -> T.Health:
        return T.Health.from_dict(self._http.json(Req("GET", "/v1/health", idempotent=True)))

    def close(self) -> None:
        """Close connections and stop the loop thread (open sessions end;
        their commands keep running in the sandbox)."""
        self._http.close()
        with self._lock:
            lt, asp, self._lt, self._aspace = self._lt, self._aspace, None, None
        if lt is not None and asp is not None:
            lt.close(asp.aclose())

    def __enter__(self) -> "Space":
        return self

    def __exit__(
        self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        self.close()

"""Templates, snapshots, API keys, secrets and quota (the management API)."""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from typing import IO, TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, List, Optional, Tuple, Union

import httpx

from . import _types as T
from ._errors import SpaceError, StreamCutError, error_from_event
from ._http import Req, escape, split_lines
from .commands import _await_all

if TYPE_CHECKING:
    from .client import AsyncSpace, Space

__all__ = [
    "Templates", "AsyncTemplates", "Snapshots", "AsyncSnapshots", "APIKeys", "AsyncAPIKeys",
    "Secrets", "AsyncSecrets", "Quotas", "AsyncQuotas", "TemplateBuildError",
]

BuildContext = Union[bytes, str, "os.PathLike[str]", IO[bytes]]
EventCallback = Callable[[T.BuildEvent], Any]


class TemplateBuildError(SpaceError):
    """A template build that ended with an ``error`` event; ``report`` says how far it got."""

    def __init__(self, err: SpaceError, report: Optional[T.BuildReport]) -> None:
        super().__init__(err.code, err.message, err.field, err.status)
        self.report = report


def tar_dir(path: Union[str, "os.PathLike[str]"]) -> bytes:
    """A build context: the directory's tree as a tar archive, names relative to it."""
    buf = io.BytesIO()
    root = os.fspath(path)
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(os.listdir(root)):
            tf.add(os.path.join(root, name), arcname=name)
    return buf.getvalue()


def _context(ctx: BuildContext) -> Union[bytes, IO[bytes]]:
    if isinstance(ctx, (bytes, bytearray)):
        return bytes(ctx)
    if isinstance(ctx, (str, os.PathLike)):
        return tar_dir(ctx)
    return ctx


def _build_req(content: Any, file: Optional[str], name: Optional[str]) -> Req:
    q: List[Tuple[str, str]] = []
    if file:
        q.append(("file", file))
    if name:
        q.append(("name", name))
    return Req("POST", "/v1/templates", params=q, content=content, content_type="application/x-tar",
               accept="application/x-ndjson")


class _BuildState:
    def __init__(self) -> None:
        self.result: Optional[Tuple[T.Template, T.BuildReport]] = None

    def event(self, line: bytes) -> T.BuildEvent:
        ev = T.BuildEvent.from_dict(json.loads(line))
        if ev.type == "done":
            self.result = (ev.template or T.Template(name="", state="", created_at=""),
                           ev.report or T.BuildReport(steps=0, executed=0, cached=0, snapshots=0, duration_ms=0))
        elif ev.type == "error":
            raw = ev.error.to_dict() if ev.error else None
            raise TemplateBuildError(error_from_event(raw), ev.report)
        return ev


def _tpl(ref: str) -> str:
    return "/v1/templates/" + escape(ref)


def _iter(f: IO[bytes]) -> Iterator[bytes]:
    while True:
        b = f.read(1 << 20)
        if not b:
            return
        yield b


async def _aiter(f: IO[bytes]) -> AsyncIterator[bytes]:
    for b in _iter(f):
        yield b


class Templates:
    def __init__(self, space: "Space") -> None:
        self._http = space._http

    def list(self) -> List[T.Template]:
        return T.TemplateList.from_dict(self._http.json(Req("GET", "/v1/templates", idempotent=True))).templates

    def get(self, ref: str) -> List[T.Template]:
        """A template's versions ("name"), or one ("name:version")."""
        return T.TemplateList.from_dict(self._http.json(Req("GET", _tpl(ref), idempotent=True))).templates

    def delete(self, ref: str) -> None:
        self._http.send(Req("DELETE", _tpl(ref), expect=(204, 200), idempotent=True))

    def build(
        self, context: BuildContext, *, file: Optional[str] = None, name: Optional[str] = None,
        on_event: Optional[EventCallback] = None,
    ) -> Tuple[T.Template, T.BuildReport]:
        """Build a template version from a build context (a directory, tar
        bytes or a binary tar stream) holding the spec file; on_event sees
        every BuildEvent. A failed build raises TemplateBuildError."""
        body = _context(context)
        content = body if isinstance(body, bytes) else _iter(body)
        st = _BuildState()
        try:
            with self._http.stream(_build_req(content, file, name)) as resp:
                buf = bytearray()
                for chunk in resp.iter_bytes():
                    for line in split_lines(buf, chunk):
                        ev = st.event(line)
                        if on_event:
                            on_event(ev)
                        if st.result:
                            return st.result
        except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
            raise StreamCutError("build stream cut: %s" % exc) from None
        raise StreamCutError("build stream ended before its done or error event")


class AsyncTemplates:
    def __init__(self, space: "AsyncSpace") -> None:
        self._http = space._http

    async def list(self) -> List[T.Template]:
        return T.TemplateList.from_dict(await self._http.json(Req("GET", "/v1/templates", idempotent=True))).templates

    async def get(self, ref: str) -> List[T.Template]:
        return T.TemplateList.from_dict(await self._http.json(Req("GET", _tpl(ref), idempotent=True))).templates

    async def delete(self, ref: str) -> None:
        await self._http.send(Req("DELETE", _tpl(ref), expect=(204, 200), idempotent=True))

    async def build(
        self, context: BuildContext, *, file: Optional[str] = None, name: Optional[str] = None,
        on_event: Optional[EventCallback] = None,
    ) -> Tuple[T.Template, T.BuildReport]:
        body = _context(context)
        content = body if isinstance(body, bytes) else _aiter(body)
        st = _BuildState()
        try:
            async with self._http.stream(_build_req(content, file, name)) as resp:
                buf = bytearray()
                async for chunk in resp.aiter_bytes():
                    for line in split_lines(buf, chunk):
                        ev = st.event(line)
                        if on_event:
                            await _await_all([on_event(ev)])
                        if st.result:
                            return st.result
        except (httpx.ReadError, httpx.RemoteProtocolError) as exc:
            raise StreamCutError("build stream cut: %s" % exc) from None
        raise StreamCutError("build stream ended before its done or error event")


def _snap(ref: str) -> str:
    return "/v1/snapshots/" + escape(ref)


class Snapshots:
    def __init__(self, space: "Space") -> None:
        self._http = space._http

    def list(self, sandbox: Optional[str] = None) -> List[T.Snapshot]:
        q = [("sandbox", sandbox)] if sandbox else []
        return T.SnapshotList.from_dict(self._http.json(Req("GET", "/v1/snapshots", params=q, idempotent=True))).snapshots

    def get(self, ref: str) -> T.Snapshot:
        return T.Snapshot.from_dict(self._http.json(Req("GET", _snap(ref), idempotent=True)))

    def delete(self, ref: str) -> None:
        self._http.send(Req("DELETE", _snap(ref), expect=(204, 200), idempotent=True))


class AsyncSnapshots:
    def __init__(self, space: "AsyncSpace") -> None:
        self._http = space._http

    async def list(self, sandbox: Optional[str] = None) -> List[T.Snapshot]:
        q = [("sandbox", sandbox)] if sandbox else []
        doc = await self._http.json(Req("GET", "/v1/snapshots", params=q, idempotent=True))
        return T.SnapshotList.from_dict(doc).snapshots

    async def get(self, ref: str) -> T.Snapshot:
        return T.Snapshot.from_dict(await self._http.json(Req("GET", _snap(ref), idempotent=True)))

    async def delete(self, ref: str) -> None:
        await self._http.send(Req("DELETE", _snap(ref), expect=(204, 200), idempotent=True))


def _key_body(name: Optional[str], team: Optional[str], admin: bool) -> Any:
    return T.CreateAPIKey(name=name, team=team, admin=admin or None).to_dict()


class APIKeys:
    def __init__(self, space: "Space") -> None:
        self._http = space._http

    def create(self, name: Optional[str] = None, *, team: Optional[str] = None, admin: bool = False) -> T.APIKey:
        """A new key; its ``secret`` is only in this reply."""
        doc = self._http.json(Req("POST", "/v1/apikeys", json=_key_body(name, team, admin), expect=(201,)))
        return T.APIKey.from_dict(doc)

    def list(self, team: Optional[str] = None) -> List[T.APIKey]:
        q = [("team", team)] if team else []
        return T.APIKeyList.from_dict(self._http.json(Req("GET", "/v1/apikeys", params=q, idempotent=True))).keys

    def delete(self, key_id: str, team: Optional[str] = None) -> None:
        """Revoke a key; another team's (admin keys) needs its team."""
        q = [("team", team)] if team else []
        self._http.send(Req("DELETE", "/v1/apikeys/" + escape(key_id), params=q, expect=(204, 200),
                            idempotent=True))


class AsyncAPIKeys:
    def __init__(self, space: "AsyncSpace") -> None:
        self._http = space._http

    async def create(self, name: Optional[str] = None, *, team: Optional[str] = None, admin: bool = False) -> T.APIKey:
        doc = await self._http.json(Req("POST", "/v1/apikeys", json=_key_body(name, team, admin), expect=(201,)))
        return T.APIKey.from_dict(doc)

    async def list(self, team: Optional[str] = None) -> List[T.APIKey]:
        q = [("team", team)] if team else []
        doc = await self._http.json(Req("GET", "/v1/apikeys", params=q, idempotent=True))
        return T.APIKeyList.from_dict(doc).keys

    async def delete(self, key_id: str, team: Optional[str] = None) -> None:
        q = [("team", team)] if team else []
        await self._http.send(Req("DELETE", "/v1/apikeys/" + escape(key_id), params=q, expect=(204, 200),
                                  idempotent=True))


def _secret_body(name: str, value: Union[bytes, str], hosts: List[str], header: Optional[str],
                 format: Optional[str]) -> Any:
    v = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return {k: x for k, x in {"name": name, "value": base64.b64encode(v).decode("ascii"), "hosts": list(hosts),
                              "header": header, "format": format}.items() if x is not None}


class Secrets:
    def __init__(self, space: "Space") -> None:
        self._http = space._http

    def create(self, name: str, value: Union[bytes, str], hosts: List[str], *, header: Optional[str] = None,
               format: Optional[str] = None) -> T.Secret:
        doc = self._http.json(Req("POST", "/v1/secrets", json=_secret_body(name, value, hosts, header, format),
                                  expect=(201,)))
        return T.Secret.from_dict(doc)

    def list(self) -> List[T.Secret]:
        return T.SecretList.from_dict(self._http.json(Req("GET", "/v1/secrets", idempotent=True))).secrets

    def delete(self, name: str) -> None:
        self._http.send(Req("DELETE", "/v1/secrets/" + escape(name), expect=(204, 200), idempotent=True))


class AsyncSecrets:
    def __init__(self, space: "AsyncSpace") -> None:
        self._http = space._http

    async def create(self, name: str, value: Union[bytes, str], hosts: List[str], *, header: Optional[str] = None,
                     format: Optional[str] = None) -> T.Secret:
        doc = await self._http.json(Req("POST", "/v1/secrets", json=_secret_body(name, value, hosts, header, format),
                                        expect=(201,)))
        return T.Secret.from_dict(doc)

    async def list(self) -> List[T.Secret]:
        return T.SecretList.from_dict(await self._http.json(Req("GET", "/v1/secrets", idempotent=True))).secrets

    async def delete(self, name: str) -> None:
        await self._http.send(Req("DELETE", "/v1/secrets/" + escape(name), expect=(204, 200), idempotent=True))


def _quota_body(sandboxes: int, vcpus: int, memory_mib: int, snapshot_mib: int) -> Any:
    return T.Quota(sandboxes=sandboxes, vcpus=vcpus, memory_mib=memory_mib, snapshot_mib=snapshot_mib).to_dict()


class Quotas:
    def __init__(self, space: "Space") -> None:
        self._http = space._http

    def get(self, team: Optional[str] = None) -> T.QuotaUsage:
        """Limits and usage of the caller's team (another team: admin key)."""
        q = [("team", team)] if team else []
        return T.QuotaUsage.from_dict(self._http.json(Req("GET", "/v1/quota", params=q, idempotent=True)))

    def set(self, *, sandboxes: int = 0, vcpus: int = 0, memory_mib: int = 0, snapshot_mib: int = 0,
            team: Optional[str] = None) -> T.QuotaUsage:
        """Replace a team's limits (admin key); 0 means unlimited."""
        q = [("team", team)] if team else []
        doc = self._http.json(Req("PUT", "/v1/quota", params=q, json=_quota_body(sandboxes, vcpus, memory_mib,
                                                                                  snapshot_mib), idempotent=True))
        return T.QuotaUsage.from_dict(doc)


class AsyncQuotas:
    def __init__(self, space: "AsyncSpace") -> None:
        self._http = space._http

    async def get(self, team: Optional[str] = None) -> T.QuotaUsage:
        q = [("team", team)] if team else []
        return T.QuotaUsage.from_dict(await self._http.json(Req("GET", "/v1/quota", params=q, idempotent=True)))

    async def set(self, *, sandboxes: int = 0, vcpus: int = 0, memory_mib: int = 0, snapshot_mib: int = 0,
                  team: Optional[str] = None) -> T.QuotaUsage:
        q = [("team", team)] if team else []
        doc = await self._http.json(Req("PUT", "/v1/quota", params=q, json=_quota_body(sandboxes, vcpus, memory_mib,
                                                                                        snapshot_mib),
                                        idempotent=True))
        return T.QuotaUsage.from_dict(doc)

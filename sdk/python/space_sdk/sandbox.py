"""Sandboxes: ``client.sandboxes`` and the Sandbox objects it returns."""

from __future__ import annotations

import math
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import datetime as _dt

from . import _types as T
from ._errors import NotFoundError
from ._http import Req, sandbox_path
from .commands import AsyncCommands, Commands
from .files import AsyncFiles, Files
from .ports import AsyncPorts, Ports
from .pty import AsyncPty, Pty

if TYPE_CHECKING:
    from .client import AsyncSpace, Space

__all__ = ["Sandbox", "AsyncSandbox", "Sandboxes", "AsyncSandboxes"]

NetworkArg = Union[T.Network, Mapping[str, Any], Sequence[str], None]
PolicyArg = Union[T.CheckpointPolicy, Mapping[str, Any], None]


def _network(n: NetworkArg) -> Optional[T.Network]:
    """A Network from a Network, its dict, or a list of allow rules."""
    if n is None or isinstance(n, T.Network):
        return n
    if isinstance(n, Mapping):
        return T.Network.from_dict(n)
    if isinstance(n, str):
        raise TypeError("network: a list of allow rules, a dict or a Network, not a str")
    return T.Network(allow=list(n))


def _policy(p: PolicyArg) -> Optional[T.CheckpointPolicy]:
    if p is None or isinstance(p, T.CheckpointPolicy):
        return p
    return T.CheckpointPolicy.from_dict(p)


def create_body(
    template: Optional[str] = None,
    vcpus: Optional[int] = None,
    memory_mib: Optional[int] = None,
    disk_mib: Optional[int] = None,
    timeout: Optional[float] = None,
    on_timeout: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    labels: Optional[Mapping[str, str]] = None,
    network: NetworkArg = None,
    secrets: Optional[Sequence[str]] = None,
    from_snapshot: Optional[str] = None,
    from_checkpoint: Optional[str] = None,
    checkpoints: PolicyArg = None,
    cold_boot: Optional[bool] = None,
) -> Dict[str, Any]:
    return T.CreateSandbox(
        template=template,
        vcpus=vcpus,
        memory_mib=memory_mib,
        disk_mib=disk_mib,
        timeout_seconds=int(math.ceil(timeout)) if timeout is not None else None,
        on_timeout=on_timeout,
        env=dict(env) if env is not None else None,
        labels=dict(labels) if labels is not None else None,
        from_snapshot=from_snapshot,
        from_checkpoint=from_checkpoint,
        checkpoints=_policy(checkpoints),
        cold_boot=cold_boot,
        network=_network(network),
        secrets=list(secrets) if secrets is not None else None,
    ).to_dict()


def _list_params(state: Union[str, Sequence[str], None], labels: Optional[Mapping[str, str]]) -> List[Tuple[str, str]]:
    q: List[Tuple[str, str]] = []
    for s in [state] if isinstance(state, str) else (state or []):
        q.append(("state", s))
    for k in sorted(labels or {}):
        q.append(("label", "%s=%s" % (k, labels[k])))  # type: ignore[index]
    return q


# Each operation once: the Req, shared by the sync and async Sandbox.
def _op(sid: str, action: str, body: Any = None, idempotent: bool = False, expect: Tuple[int, ...] = (200,)) -> Req:
    return Req("POST", sandbox_path(sid, "/" + action), json=body, idempotent=idempotent, expect=expect)


def _put(sid: str, what: str, body: Any) -> Req:
    return Req("PUT", sandbox_path(sid, "/" + what), json=body, idempotent=True)


def _restore_body(snapshot: Optional[str], checkpoint: Optional[str]) -> Dict[str, Any]:
    if (snapshot is None) == (checkpoint is None):
        raise ValueError("restore: give snapshot or checkpoint (one of them)")
    return T.RestoreSandbox(snapshot=snapshot, checkpoint=checkpoint).to_dict()


class _Base:
    """What Sandbox and AsyncSandbox share: the description and its accessors."""

    info: Optional[T.Sandbox]

    def __init__(self, sandbox_id: str, info: Optional[T.Sandbox]) -> None:
        self.id = sandbox_id
        self.info = info

    def _set(self, doc: Mapping[str, Any]) -> None:
        self.info = T.Sandbox.from_dict(doc)

    @property
    def state(self) -> str:
        """The state when last fetched (``refresh()`` to update)."""
        return self.info.state if self.info else ""

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self.info.labels or {}) if self.info else {}

    def __repr__(self) -> str:
        return "<%s %s %s>" % (type(self).__name__, self.id, self.state or "?")


class Sandbox(_Base):
    """A sandbox of the sync API. ``with`` deletes it on exit."""

    def __init__(self, space: "Space", sandbox_id: str, info: Optional[T.Sandbox] = None) -> None:
        super().__init__(sandbox_id, info)
        self._space = space
        self._owns_space = False
        self.commands = Commands(self)
        self.files = Files(self)
        self.pty = Pty(self)
        self.ports = Ports(self)

    def _call(self, req: Req) -> "Sandbox":
        self._set(self._space._http.json(req))
        return self

    def refresh(self) -> "Sandbox":
        return self._call(Req("GET", sandbox_path(self.id), idempotent=True))

    def delete(self, missing_ok: bool = False) -> None:
        """Stop the VM and delete the sandbox."""
        try:
            self._space._http.send(Req("DELETE", sandbox_path(self.id), expect=(204, 200), idempotent=True))
        except NotFoundError:
            if not missing_ok:
                raise

    kill = delete

    def pause(self) -> "Sandbox":
        return self._call(_op(self.id, "pause", idempotent=True))

    def suspend(self) -> "Sandbox":
        return self._call(_op(self.id, "suspend"))

    def resume(self) -> "Sandbox":
        return self._call(_op(self.id, "resume", idempotent=True))

    def set_timeout(self, seconds: float) -> "Sandbox":
        """Expire (or with on_timeout suspend, idle out) seconds from now."""
        return self._call(_op(self.id, "timeout", {"timeout_seconds": int(math.ceil(seconds))}, idempotent=True))

    def set_network(self, network: NetworkArg) -> "Sandbox":
        """Replace the egress policy (a Network, its dict, or a list of allow rules)."""
        n = _network(network) or T.Network()
        return self._call(_put(self.id, "network", n.to_dict()))

    def set_secrets(self, names: Sequence[str]) -> "Sandbox":
        """Grant exactly these team secrets from now on ([] for none)."""
        return self._call(_put(self.id, "secrets", {"secrets": list(names)}))

    def snapshot(self, name: Optional[str] = None) -> T.Snapshot:
        """Take a live snapshot (the sandbox runs on)."""
        doc = self._space._http.json(_op(self.id, "snapshots", T.CreateSnapshot(name=name).to_dict(), expect=(201,)))
        return T.Snapshot.from_dict(doc)

    def restore(self, snapshot: Optional[str] = None, checkpoint: Optional[str] = None) -> "Sandbox":
        """Roll back in place to a snapshot (ID or name) or checkpoint."""
        return self._call(_op(self.id, "restore", _restore_body(snapshot, checkpoint)))

    def fork(self, count: int = 1) -> List["Sandbox"]:
        """count running copies of this sandbox, as new sandboxes."""
        doc = self._space._http.json(_op(self.id, "fork", {"count": int(count)}, expect=(201,)))
        return [Sandbox(self._space, s.id, s) for s in T.SandboxList.from_dict(doc).sandboxes]

    def checkpoints(self) -> T.CheckpointList:
        return T.CheckpointList.from_dict(
            self._space._http.json(Req("GET", sandbox_path(self.id, "/checkpoints"), idempotent=True)))

    def metrics(self, start: TimeArg = None, end: TimeArg = None) -> T.SandboxMetrics:
        """Usage history (CPU, memory, disk, network) between start and end, oldest first.

        start and end are datetimes, unix seconds or RFC 3339 strings; None leaves that side open."""
        return T.SandboxMetrics.from_dict(self._space._http.json(_metrics_req(self.id, start, end)))

    def checkpoint(self) -> T.Checkpoint:
        """Take a checkpoint now."""
        return T.Checkpoint.from_dict(self._space._http.json(_op(self.id, "checkpoints", expect=(201,))))

    def set_checkpoint_policy(self, policy: PolicyArg) -> "Sandbox":
        p = _policy(policy) or T.CheckpointPolicy()
        return self._call(_put(self.id, "checkpoints/policy", p.to_dict()))

    def port_open(self, port: int) -> bool:
        """Whether something in the sandbox accepts TCP connections on port (``ports.is_open``)."""
        return self.ports.is_open(port)

    @classmethod
    def create(
        cls, template: Optional[str] = None, *, api_url: Optional[str] = None, api_key: Optional[str] = None, **kw: Any
    ) -> "Sandbox":
        """Create a sandbox with a client of its own (``Space(api_url,
        api_key)``: $SPACE_API_URL and $SPACE_API_KEY by default), which
        ``close()`` or the end of a ``with`` block closes; keyword
        arguments are those of ``Space().sandboxes.create``. Forks and
        sandboxes connected through ``sb.space`` share that client."""
        from .client import Space

        space = Space(api_url, api_key)
        try:
            sb = space.sandboxes.create(template, **kw)
        except BaseException:
            space.close()
            raise
        sb._owns_space = True
        return sb

    @property
    def space(self) -> "Space":
        """The client this sandbox talks through."""
        return self._space

    def close(self) -> None:
        """Close the client Sandbox.create made (the sandbox keeps running); no-op otherwise."""
        if self._owns_space:
            self._space.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        try:
            self.delete(missing_ok=True)
        finally:
            self.close()


class AsyncSandbox(_Base):
    """A sandbox of the async API. ``async with`` deletes it on exit."""

    def __init__(self, space: "AsyncSpace", sandbox_id: str, info: Optional[T.Sandbox] = None) -> None:
        super().__init__(sandbox_id, info)
        self._space = space
        self._owns_space = False
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.pty = AsyncPty(self)
        self.ports = AsyncPorts(self)

    async def _call(self, req: Req) -> "AsyncSandbox":
        self._set(await self._space._http.json(req))
        return self

    async def refresh(self) -> "AsyncSandbox":
        return await self._call(Req("GET", sandbox_path(self.id), idempotent=True))

    async def delete(self, missing_ok: bool = False) -> None:
        try:
            await self._space._http.send(Req("DELETE", sandbox_path(self.id), expect=(204, 200), idempotent=True))
        except NotFoundError:
            if not missing_ok:
                raise

    kill = delete

    async def pause(self) -> "AsyncSandbox":
        return await self._call(_op(self.id, "pause", idempotent=True))

    async def suspend(self) -> "AsyncSandbox":
        return await self._call(_op(self.id, "suspend"))

    async def resume(self) -> "AsyncSandbox":
        return await self._call(_op(self.id, "resume", idempotent=True))

    async def set_timeout(self, seconds: float) -> "AsyncSandbox":
        return await self._call(
            _op(self.id, "timeout", {"timeout_seconds": int(math.ceil(seconds))}, idempotent=True))

    async def set_network(self, network: NetworkArg) -> "AsyncSandbox":
        n = _network(network) or T.Network()
        return await self._call(_put(self.id, "network", n.to_dict()))

    async def set_secrets(self, names: Sequence[str]) -> "AsyncSandbox":
        return await self._call(_put(self.id, "secrets", {"secrets": list(names)}))

    async def snapshot(self, name: Optional[str] = None) -> T.Snapshot:
        doc = await self._space._http.json(
            _op(self.id, "snapshots", T.CreateSnapshot(name=name).to_dict(), expect=(201,)))
        return T.Snapshot.from_dict(doc)

    async def restore(self, snapshot: Optional[str] = None, checkpoint: Optional[str] = None) -> "AsyncSandbox":
        return await self._call(_op(self.id, "restore", _restore_body(snapshot, checkpoint)))

    async def fork(self, count: int = 1) -> List["AsyncSandbox"]:
        doc = await self._space._http.json(_op(self.id, "fork", {"count": int(count)}, expect=(201,)))
        return [AsyncSandbox(self._space, s.id, s) for s in T.SandboxList.from_dict(doc).sandboxes]

    async def checkpoints(self) -> T.CheckpointList:
        return T.CheckpointList.from_dict(
            await self._space._http.json(Req("GET", sandbox_path(self.id, "/checkpoints"), idempotent=True)))

    async def metrics(self, start: TimeArg = None, end: TimeArg = None) -> T.SandboxMetrics:
        """Usage history between start and end, oldest first (see Sandbox.metrics)."""
        return T.SandboxMetrics.from_dict(await self._space._http.json(_metrics_req(self.id, start, end)))

    async def checkpoint(self) -> T.Checkpoint:
        return T.Checkpoint.from_dict(await self._space._http.json(_op(self.id, "checkpoints", expect=(201,))))

    async def set_checkpoint_policy(self, policy: PolicyArg) -> "AsyncSandbox":
        p = _policy(policy) or T.CheckpointPolicy()
        return await self._call(_put(self.id, "checkpoints/policy", p.to_dict()))

    async def port_open(self, port: int) -> bool:
        return await self.ports.is_open(port)

    @classmethod
    def create(
        cls, template: Optional[str] = None, *, api_url: Optional[str] = None, api_key: Optional[str] = None, **kw: Any
    ) -> "_CreateCall":
        """As Sandbox.create, for asyncio: ``sb = await AsyncSandbox.create()``
        (then ``await sb.close()``) or ``async with AsyncSandbox.create() as sb:``."""
        from .client import AsyncSpace

        space = AsyncSpace(api_url, api_key)
        call = space.sandboxes.create(template, **kw)
        call._owns_space = True
        return call

    @property
    def space(self) -> "AsyncSpace":
        return self._space

    async def close(self) -> None:
        """Close the client AsyncSandbox.create made (the sandbox keeps running); no-op otherwise."""
        if self._owns_space:
            await self._space.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(
        self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        try:
            await self.delete(missing_ok=True)
        finally:
            await self.close()


def _create_req(body: Dict[str, Any]) -> Req:
    return Req("POST", "/v1/sandboxes", json=body, expect=(201,))  # creates: never retried


class Sandboxes:
    """``client.sandboxes`` of the sync API."""

    def __init__(self, space: "Space") -> None:
        self._space = space

    def create(
        self,
        template: Optional[str] = None,
        *,
        vcpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        timeout: Optional[float] = None,
        on_timeout: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        network: NetworkArg = None,
        secrets: Optional[Sequence[str]] = None,
        from_snapshot: Optional[str] = None,
        from_checkpoint: Optional[str] = None,
        checkpoints: PolicyArg = None,
        cold_boot: Optional[bool] = None,
    ) -> Sandbox:
        """Create a sandbox and start its VM (every CreateSandbox field;
        timeout is timeout_seconds). Omitted fields take the server's defaults."""
        body = create_body(template, vcpus, memory_mib, disk_mib, timeout, on_timeout, env, labels, network,
                           secrets, from_snapshot, from_checkpoint, checkpoints, cold_boot)
        info = T.Sandbox.from_dict(self._space._http.json(_create_req(body)))
        return Sandbox(self._space, info.id, info)

    def get(self, sandbox_id: str) -> Sandbox:
        return Sandbox(self._space, sandbox_id).refresh()

    def connect(self, sandbox_id: str) -> Sandbox:
        """A Sandbox for an ID, without asking the server (info stays None)."""
        return Sandbox(self._space, sandbox_id)

    def list(
        self, state: Union[str, Sequence[str], None] = None, labels: Optional[Mapping[str, str]] = None
    ) -> List[Sandbox]:
        """The team's sandboxes, in any of the states given, carrying all the labels given."""
        doc = self._space._http.json(Req("GET", "/v1/sandboxes", params=_list_params(state, labels), idempotent=True))
        return [Sandbox(self._space, s.id, s) for s in T.SandboxList.from_dict(doc).sandboxes]


class _CreateCall:
    """What AsyncSandboxes.create returns: await it for the sandbox, or
    ``async with`` it to have the sandbox deleted at the end."""

    def __init__(self, space: "AsyncSpace", body: Dict[str, Any]) -> None:
        self._space = space
        self._body = body
        self._sb: Optional[AsyncSandbox] = None
        self._owns_space = False  # AsyncSandbox.create's own client

    async def _create(self) -> AsyncSandbox:
        try:
            info = T.Sandbox.from_dict(await self._space._http.json(_create_req(self._body)))
        except BaseException:
            if self._owns_space:
                await self._space.aclose()
            raise
        self._sb = AsyncSandbox(self._space, info.id, info)
        self._sb._owns_space = self._owns_space
        return self._sb

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._create().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        return await self._create()

    async def __aexit__(
        self, et: Optional[Type[BaseException]], ev: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if self._sb is not None:
            await self._sb.__aexit__(et, ev, tb)


class AsyncSandboxes:
    """``client.sandboxes`` of the async API."""

    def __init__(self, space: "AsyncSpace") -> None:
        self._space = space

    def create(
        self,
        template: Optional[str] = None,
        *,
        vcpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        timeout: Optional[float] = None,
        on_timeout: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
        network: NetworkArg = None,
        secrets: Optional[Sequence[str]] = None,
        from_snapshot: Optional[str] = None,
        from_checkpoint: Optional[str] = None,
        checkpoints: PolicyArg = None,
        cold_boot: Optional[bool] = None,
    ) -> _CreateCall:
        """``sb = await create(...)`` or ``async with create(...) as sb:``."""
        body = create_body(template, vcpus, memory_mib, disk_mib, timeout, on_timeout, env, labels, network,
                           secrets, from_snapshot, from_checkpoint, checkpoints, cold_boot)
        return _CreateCall(self._space, body)

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return await AsyncSandbox(self._space, sandbox_id).refresh()

    def connect(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self._space, sandbox_id)

    async def list(
        self, state: Union[str, Sequence[str], None] = None, labels: Optional[Mapping[str, str]] = None
    ) -> List[AsyncSandbox]:
        doc = await self._space._http.json(
            Req("GET", "/v1/sandboxes", params=_list_params(state, labels), idempotent=True))
        return [AsyncSandbox(self._space, s.id, s) for s in T.SandboxList.from_dict(doc).sandboxes]


TimeArg = Union[None, int, float, str, _dt.datetime]


def _instant(v: Union[int, float, str, _dt.datetime]) -> str:
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=_dt.timezone.utc)
        return v.astimezone(_dt.timezone.utc).isoformat().replace("+00:00", "Z")
    if isinstance(v, (int, float)):
        return str(int(v))
    return v


def _metrics_req(sid: str, start: TimeArg, end: TimeArg) -> Req:
    params = [(k, _instant(v)) for k, v in (("start", start), ("end", end)) if v is not None]
    return Req("GET", sandbox_path(sid, "/metrics"), params=params, idempotent=True)

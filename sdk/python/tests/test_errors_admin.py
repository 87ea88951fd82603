"""Every typed error, and the management API: templates, API keys, quota, secrets."""

from __future__ import annotations

import io
import tarfile
import uuid

import pytest

from space_sdk import (
    AuthenticationError,
    ConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    Sandbox,
    Space,
    SpaceError,
)

from .conftest import sandbox_args


def test_not_found(space: Space, shared: Sandbox) -> None:
    with pytest.raises(NotFoundError) as ei:
        space.sandboxes.get("sbx_doesnotexist")
    e = ei.value
    assert (e.code, e.status) == ("not_found", 404) and "not found" in e.message
    with pytest.raises(NotFoundError):
        shared.commands.get(987654)
    with pytest.raises(NotFoundError):
        space.snapshots.get("no-such-snapshot")
    with pytest.raises(NotFoundError):
        space.api_keys.delete("key_doesnotexist")


def test_invalid_argument(space: Space, shared: Sandbox) -> None:
    with pytest.raises(InvalidArgumentError) as ei:
        space.sandboxes.create(**sandbox_args(memory_mib=1))
    assert (ei.value.field, ei.value.status) == ("memory_mib", 400)
    with pytest.raises(InvalidArgumentError) as ei:
        space.sandboxes.create(**sandbox_args(template="no-such-template"))
    assert ei.value.field == "template"
    with pytest.raises(InvalidArgumentError) as ei:
        shared.set_timeout(10**9)
    assert ei.value.field == "timeout_seconds"
    with pytest.raises(InvalidArgumentError):
        shared.set_network(["not a rule!"])


def test_conflict(space: Space, shared: Sandbox) -> None:
    with pytest.raises(FailedPreconditionError) as ei:
        space.templates.delete("default")  # a built-in template
    assert ei.value.status == 409
    assert isinstance(ei.value, ConflictError)
    with pytest.raises(ConflictError):
        shared.files.write("/tmp", "x")  # a directory


def test_unauthenticated() -> None:
    with Space(api_key="not-a-key") as bad:
        assert bad.health().status == "ok"  # needs no key
        with pytest.raises(AuthenticationError) as ei:
            bad.sandboxes.list()
        assert (ei.value.code, ei.value.status) == ("unauthenticated", 401)


def test_team_key_quota_and_permission(space: Space) -> None:
    team = "sdk-" + uuid.uuid4().hex[:8]
    key = space.api_keys.create("sdk-test", team=team)
    assert key.secret and key.team == team and not key.admin
    try:
        assert key.id in [k.id for k in space.api_keys.list(team=team)]
        usage = space.quota.set(team=team, sandboxes=1, vcpus=1, memory_mib=128, snapshot_mib=0)
        assert usage.limits.memory_mib == 128
        with Space(api_key=key.secret) as tk:
            q = tk.quota.get()
            assert q.limits.memory_mib == 128 and q.used.sandboxes == 0
            with pytest.raises(QuotaExceededError) as ei:
                tk.sandboxes.create(**sandbox_args())  # 256 MiB > 128
            assert (ei.value.code, ei.value.status) == ("resource_exhausted", 429)
            with pytest.raises(PermissionDeniedError):
                tk.api_keys.create(team="someone-else")
            with pytest.raises(PermissionDeniedError):
                tk.quota.set(sandboxes=100)
            assert tk.sandboxes.list() == [], "a team sees only its own sandboxes"
    finally:
        space.api_keys.delete(key.id, team=team)  # ?team= is needed, though the spec does not say so
    with Space(api_key=key.secret) as revoked:
        with pytest.raises(AuthenticationError):
            revoked.sandboxes.list()


def test_templates(space: Space) -> None:
    tpls = space.templates.list()
    default = [t for t in tpls if t.default]
    assert len(default) == 1 and default[0].state == "ready"
    assert [t.name for t in space.templates.get(default[0].name)] == [default[0].name]
    with pytest.raises(NotFoundError):
        space.templates.get("no-such-template")


def test_template_build_errors(space: Space) -> None:
    with pytest.raises(InvalidArgumentError) as ei:
        space.templates.build(b"this is not a tar archive", name="sdk-bad")
    assert ei.value.field == "context"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        spec = b"name: sdk-bad\nbase: {}\nsteps: [{nonsense: 1}]\n"
        ti = tarfile.TarInfo("space.yaml")
        ti.size = len(spec)
        tf.addfile(ti, io.BytesIO(spec))
    with pytest.raises(SpaceError) as ei2:
        space.templates.build(buf.getvalue())
    assert ei2.value.code in ("invalid_argument", "failed_precondition")


def test_secrets(space: Space) -> None:
    name = "sdk_" + uuid.uuid4().hex[:8]
    s = space.secrets.create(name, b"v", ["api.example.com"])
    try:
        assert s.name == name and s.hosts == ["api.example.com"]
        assert name in [x.name for x in space.secrets.list()]
        with pytest.raises(ConflictError):
            space.secrets.create(name, b"v", ["api.example.com"])
    finally:
        space.secrets.delete(name)
    with pytest.raises(NotFoundError):
        space.secrets.delete(name)

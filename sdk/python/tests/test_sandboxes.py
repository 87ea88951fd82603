"""Sandbox lifecycle: create with every field, get/list with filters,
timeout, network, secrets, pause/resume, suspend/resume, context managers."""

from __future__ import annotations

import time
import uuid

import pytest

from space_sdk import ConflictError, NotFoundError, Sandbox, Space, types

from .conftest import LABELS, sandbox_args


def test_create_with_every_field_then_get_and_list(space: Space) -> None:
    secret = "sdk_" + uuid.uuid4().hex[:8]
    space.secrets.create(secret, "s3cr3t", ["api.example.com"], header="Authorization", format="Bearer {}")
    try:
        with space.sandboxes.create(
            "default",
            vcpus=1,
            memory_mib=256,
            disk_mib=1024,
            timeout=900,
            on_timeout="delete",
            env={"GREETING": "hi"},
            labels={**LABELS, "case": "every-field"},
            network={"allow": ["example.com:443"], "max_connections": 16},
            secrets=[secret],
            checkpoints={"every": "1h", "keep": 3},
            cold_boot=False,
        ) as sb:
            info = sb.info
            assert info is not None and info.state == "running"
            assert (info.template, info.vcpus, info.memory_mib, info.disk_mib) == ("default", 1, 256, 1024)
            assert info.on_timeout == "delete" and info.expires_at
            assert info.env == {"GREETING": "hi"} and info.labels and info.labels["case"] == "every-field"
            assert info.network is not None and "example.com:443" in (info.network.allow or [])
            assert "api.example.com:443" in (info.network.allow or []), "a secret's host is allowed"
            assert info.secrets == [secret]
            assert info.checkpoints is not None and info.checkpoints.every in ("1h", "1h0m0s") and info.checkpoints.keep == 3
            assert sb.commands.run("echo $GREETING; test -n \"$%s\" && echo has-placeholder" % secret.upper()).stdout \
                == "hi\nhas-placeholder\n"

            got = space.sandboxes.get(sb.id)
            assert got.id == sb.id and got.labels["case"] == "every-field"
            ids = [s.id for s in space.sandboxes.list(labels={"case": "every-field", **LABELS})]
            assert ids == [sb.id]
            assert sb.id in [s.id for s in space.sandboxes.list(state="running")]
            assert sb.id in [s.id for s in space.sandboxes.list(state=["paused", "running"])]
            assert sb.id not in [s.id for s in space.sandboxes.list(state="paused")]
            assert space.sandboxes.list(labels={"case": "no-such-label"}) == []

            # The network policy and the secret grants change in place.
            sb.set_network(["pypi.org:443"])
            assert sb.info is not None and sb.info.network is not None and sb.info.network.allow == ["pypi.org:443"]
            sb.set_network(types.Network(off=True))
            assert sb.info.network is not None and sb.info.network.off is True
            sb.set_secrets([])
            assert not sb.info.secrets
        with pytest.raises(NotFoundError):
            space.sandboxes.get(sb.id)  # the with block deleted it
    finally:
        space.secrets.delete(secret)


def test_set_timeout(sandbox: Sandbox) -> None:
    assert sandbox.info is not None
    before = sandbox.info.expires_at
    sandbox.set_timeout(3)
    assert sandbox.info.expires_at != before
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if sandbox.refresh().state in ("stopping", "deleted", "stopped"):
                break
        except NotFoundError:
            break
        time.sleep(1)
    else:
        pytest.fail("the sandbox did not expire 3 s after set_timeout(3)")


def test_pause_resume(sandbox: Sandbox) -> None:
    sandbox.commands.run("echo kept > /tmp/state")
    assert sandbox.pause().state == "paused"
    assert sandbox.pause().state == "paused"  # a no-op
    with pytest.raises(ConflictError):
        sandbox.commands.run("true")  # no commands while paused
    assert sandbox.resume().state == "running"
    assert sandbox.files.read_text("/tmp/state") == "kept\n"


def test_suspend_resume(space: Space, sandbox: Sandbox) -> None:
    h = sandbox.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done",
                             background=True)
    time.sleep(1)
    sb = sandbox.suspend()
    assert sb.state == "suspended" and sb.info is not None and sb.info.suspended_snapshot
    assert space.quota.get().used.sandboxes >= 0
    with pytest.raises(ConflictError):
        sandbox.files.read("/tmp/counter")
    assert sandbox.resume().state == "running"
    a = int(sandbox.files.read_text("/tmp/counter"))
    assert a > 0, "the disk survives the suspend"
    if sandbox.info is not None and sandbox.info.vm is not None and sandbox.info.vm.vmm == "fake":
        return  # the fake VMM's snapshots keep files, not processes
    time.sleep(1)
    b = int(sandbox.files.read_text("/tmp/counter"))
    assert b > a, "the process runs on after the resume"
    assert any(p.id == h.pid and p.running for p in sandbox.commands.list())


def test_context_manager_deletes(space: Space) -> None:
    with space.sandboxes.create(**sandbox_args()) as sb:
        sid = sb.id
        assert sb.commands.run("true").ok
    with pytest.raises(NotFoundError):
        space.sandboxes.get(sid)
    sb.delete(missing_ok=True)  # gone already: fine
    with pytest.raises(NotFoundError):
        sb.delete()


def test_metrics(sandbox: Sandbox) -> None:
    # The worker samples every few seconds: wait for the first sample.
    deadline = time.monotonic() + 60
    m = sandbox.metrics()
    while not m.samples and time.monotonic() < deadline:
        time.sleep(1)
        m = sandbox.metrics()
    assert m.sandbox_id == sandbox.id and m.interval_seconds > 0
    assert m.samples, "no usage sample within a minute"
    last = m.samples[-1]
    assert last.time and 0 <= last.cpu_used_pct <= 100
    assert sandbox.metrics(start=0, end=1).samples == []
    assert sandbox.metrics(start=time.time() - 3600).samples

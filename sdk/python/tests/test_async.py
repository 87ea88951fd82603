"""The asyncio API on the main paths."""

from __future__ import annotations

import asyncio
import hashlib
import io
from typing import AsyncIterator, List

import pytest

from space_sdk import AsyncSandbox, AsyncSpace, ConflictError, InvalidArgumentError, NotFoundError

from .conftest import LABELS, sandbox_args


@pytest.fixture
async def aspace() -> AsyncIterator[AsyncSpace]:
    async with AsyncSpace() as s:
        yield s


async def test_async_lifecycle_commands_files(aspace: AsyncSpace) -> None:
    async with aspace.sandboxes.create(**sandbox_args(env={"A": "1"}, labels={"case": "async"})) as sb:
        assert isinstance(sb, AsyncSandbox) and sb.state == "running"
        assert [s.id for s in await aspace.sandboxes.list(labels={**LABELS, "case": "async"})] == [sb.id]
        assert (await aspace.sandboxes.get(sb.id)).id == sb.id

        out: List[str] = []

        async def on_err(s: str) -> None:  # coroutine callbacks are awaited
            out.append("err:" + s)

        r = await sb.commands.run("echo $A; echo x >&2; exit 2", on_stdout=out.append, on_stderr=on_err)
        assert (r.stdout, r.stderr, r.exit_code) == ("1\n", "x\n", 2)
        assert sorted(out) == ["1\n", "err:x\n"]
        assert (await sb.commands.run("cat", stdin=b"in")).stdout == "in"

        data = bytes(range(256)) * 4096
        await sb.files.write("/tmp/a/b.bin", io.BytesIO(data), mode=0o600)
        assert await sb.files.read("/tmp/a/b.bin") == data
        assert [(e.name, e.mode) for e in await sb.files.list("/tmp/a")] == [("b.bin", 0o600)]
        assert await sb.files.make_dir("/tmp/a/d") is True
        assert await sb.files.exists("/tmp/a/d")
        w = await sb.files.watch("/tmp/a")
        async with w:
            await sb.files.write("/tmp/a/w.txt", "w")
            async for ev in w:
                if ev.type == "create" and ev.name == "w.txt":
                    break
        assert (await sb.files.move("/tmp/a/w.txt", "/tmp/a/d/w2.txt")).path == "/tmp/a/d/w2.txt"
        await sb.files.remove("/tmp/a", recursive=True)
        with pytest.raises(NotFoundError):
            await sb.files.read_text("/tmp/a/b.bin")

        # Background, stdin, re-attach from another handle, signal.
        first: List[str] = []
        h = await sb.commands.run("read l; echo got $l; sleep 1; echo later; sleep 60", background=True,
                                  on_stdout=first.append)
        await h.send_stdin("x\n")
        for _ in range(300):
            if first:
                break
            await asyncio.sleep(0.1)
        assert first == ["got x\n"]
        await h.disconnect()
        await asyncio.sleep(2)  # "later" is written while detached: buffered
        h2 = await sb.commands.connect(h.pid)
        await h2.signal(15)
        r2 = await h2.wait(timeout=30)
        assert r2.stdout == "later\n" and (r2.signal == 15 or r2.exit_code == 143)

        with pytest.raises(asyncio.TimeoutError):
            h3 = await sb.commands.run("sleep 30", background=True)
            await h3.wait(timeout=0.5)
        await h3.kill()
        assert (await h3.wait(timeout=30)).exit_code != 0

        # PTY.
        t = await sb.pty.create(cols=90, rows=30)
        await t.send_input("stty size; exit\n")
        assert (await t.wait(timeout=30)).exit_code == 0 and b"30 90" in t.output

        assert (await sb.pause()).state == "paused"
        with pytest.raises(ConflictError):
            await sb.files.read("/etc/hostname")
        assert (await sb.resume()).state == "running"
        assert (await sb.set_timeout(600)).info is not None
    with pytest.raises(NotFoundError):
        await aspace.sandboxes.get(sb.id)


async def test_async_errors_snapshot_fork(aspace: AsyncSpace) -> None:
    with pytest.raises(InvalidArgumentError) as ei:
        await aspace.sandboxes.create(**sandbox_args(vcpus=99))
    assert ei.value.field == "vcpus"
    sb = await aspace.sandboxes.create(**sandbox_args())
    try:
        await sb.files.write("/root/v", "1")
        snap = await sb.snapshot()
        await sb.files.write("/root/v", "2")
        await sb.restore(snap.id)
        assert await sb.files.read_text("/root/v") == "1"
        (child,) = await sb.fork(1)
        async with child:
            assert await child.files.read_text("/root/v") == "1"
        await aspace.snapshots.delete(snap.id)
        assert snap.id not in [s.id for s in await aspace.snapshots.list()]
        assert (await aspace.quota.get()).limits is not None
        assert any(t.default for t in await aspace.templates.list())
    finally:
        await sb.delete()


@pytest.mark.slow
async def test_async_large_stdout(aspace: AsyncSpace) -> None:
    async with aspace.sandboxes.create(**sandbox_args()) as sb:
        r = await sb.commands.run("head -c 20971520 /dev/urandom | tee /tmp/o")
        guest = (await sb.commands.run("sha256sum /tmp/o")).stdout.split()[0]
        assert len(r.stdout_bytes) == 20 << 20 and hashlib.sha256(r.stdout_bytes).hexdigest() == guest

"""snapshot, restore, fork, create from_snapshot; snapshots list/get/delete."""

from __future__ import annotations

import uuid

import pytest

from space_sdk import ConflictError, NotFoundError, Sandbox, Space

from .conftest import sandbox_args


def test_snapshot_restore(space: Space, sandbox: Sandbox) -> None:
    name = "sdk-" + uuid.uuid4().hex[:8]
    sandbox.files.write("/root/marker", "before")
    snap = sandbox.snapshot(name)
    try:
        assert snap.name == name and snap.sandbox_id == sandbox.id and snap.id.startswith("snp_")
        assert space.snapshots.get(name).id == snap.id
        assert snap.id in [s.id for s in space.snapshots.list(sandbox=sandbox.id)]
        with pytest.raises(ConflictError):
            sandbox.snapshot(name)  # names are unique in the team
        sandbox.files.write("/root/marker", "after")
        assert sandbox.restore(name).state == "running"
        assert sandbox.files.read_text("/root/marker") == "before"
        assert sandbox.id == sandbox.refresh().id
    finally:
        space.snapshots.delete(snap.id)
    with pytest.raises(NotFoundError):
        space.snapshots.get(snap.id)


def test_fork_and_create_from_snapshot(space: Space, sandbox: Sandbox) -> None:
    sandbox.files.write("/root/who", "parent")
    (child,) = sandbox.fork(1)
    try:
        assert child.id != sandbox.id and child.state == "running"
        assert child.files.read_text("/root/who") == "parent"
        child.files.write("/root/who", "child")
        assert sandbox.files.read_text("/root/who") == "parent", "the copy has its own disk"
    finally:
        child.delete()
    snap = sandbox.snapshot()
    try:
        with space.sandboxes.create(from_snapshot=snap.id, labels=sandbox_args()["labels"]) as copy:
            assert copy.files.read_text("/root/who") == "parent"
    finally:
        space.snapshots.delete(snap.id)

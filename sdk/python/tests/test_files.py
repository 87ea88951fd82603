"""sandbox.files: text, bytes, large streamed transfers, list, remove, mkdir, modes, stat, move,
metadata, watch."""

from __future__ import annotations

import hashlib
import io
import os

import pytest

from space_sdk import ConflictError, FailedPreconditionError, NotFoundError, Sandbox


def test_text_and_bytes(shared: Sandbox) -> None:
    w = shared.files.write("/tmp/f/hello.txt", "héllo\n")
    assert (w.path, w.size) == ("/tmp/f/hello.txt", 7)
    assert shared.files.read_text("/tmp/f/hello.txt") == "héllo\n"
    blob = bytes(range(256)) * 3
    shared.files.write("/tmp/f/blob.bin", blob)
    assert shared.files.read("/tmp/f/blob.bin") == blob
    assert shared.commands.run("cat /tmp/f/hello.txt").stdout == "héllo\n"
    # Replacing keeps one file with the new content.
    shared.files.write("/tmp/f/hello.txt", b"new")
    assert shared.files.read("/tmp/f/hello.txt") == b"new"


def test_mode_and_mkdir(shared: Sandbox) -> None:
    shared.files.write("/tmp/m/a/b/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    info = {e.name: e for e in shared.files.list("/tmp/m/a/b")}
    assert info["run.sh"].mode == 0o755 and info["run.sh"].type == "file"
    assert shared.commands.run("/tmp/m/a/b/run.sh").stdout == "ran\n"
    with pytest.raises(NotFoundError):
        shared.files.write("/tmp/nodir/x/y.txt", "x", mkdir=False)


@pytest.mark.slow
def test_large_streaming_round_trip(shared: Sandbox, tmp_path: "os.PathLike[str]") -> None:
    data = os.urandom(24 << 20)
    src = io.BytesIO(data)  # a file-like: streamed, not read whole first
    w = shared.files.write("/tmp/large.bin", src)
    assert w.size == len(data)
    assert shared.commands.run("sha256sum /tmp/large.bin").stdout.split()[0] == hashlib.sha256(data).hexdigest()
    dest = io.BytesIO()
    assert shared.files.read_to("/tmp/large.bin", dest) == len(data)
    assert hashlib.sha256(dest.getvalue()).digest() == hashlib.sha256(data).digest()
    n = sum(len(c) for c in shared.files.iter_read("/tmp/large.bin"))
    assert n == len(data)
    p = os.path.join(os.fspath(tmp_path), "up.bin")
    with open(p, "wb") as f:
        f.write(data[: 3 << 20])
    with open(p, "rb") as f:
        shared.files.write("/tmp/fromfile.bin", f)
    assert shared.files.read("/tmp/fromfile.bin") == data[: 3 << 20]
    shared.files.remove("/tmp/large.bin")
    shared.files.remove("/tmp/fromfile.bin")


def test_list_remove_make_dir(shared: Sandbox) -> None:
    shared.files.make_dir("/tmp/d1/d2/d3")
    shared.files.make_dir("/tmp/d1/d2/d3")  # exists already: fine
    shared.files.write("/tmp/d1/f.txt", "x")
    entries = {e.name: e.type for e in shared.files.list("/tmp/d1")}
    assert entries == {"d2": "dir", "f.txt": "file"}
    assert shared.files.exists("/tmp/d1/d2/d3") and not shared.files.exists("/tmp/d1/nope")
    shared.files.remove("/tmp/d1/f.txt")
    assert not shared.files.exists("/tmp/d1/f.txt")
    with pytest.raises(Exception):
        shared.files.remove("/tmp/d1")  # not empty, not recursive
    shared.files.remove("/tmp/d1", recursive=True)
    assert not shared.files.exists("/tmp/d1")


def test_tar_round_trip(shared: Sandbox) -> None:
    shared.files.write("/tmp/t/a.txt", "A")
    shared.files.write("/tmp/t/sub/b.txt", "B")
    archive = shared.files.read_tar("/tmp/t")
    tw = shared.files.write_tar("/tmp/t2", archive)
    assert tw.bytes == 2
    assert shared.files.read_text("/tmp/t2/sub/b.txt") == "B"


def test_file_errors(shared: Sandbox) -> None:
    with pytest.raises(NotFoundError) as ei:
        shared.files.read("/no/such/file")
    assert ei.value.status == 404 and ei.value.code == "not_found"
    with pytest.raises(NotFoundError):
        shared.files.list("/no/such/dir")
    with pytest.raises(ValueError):
        shared.files.read("relative/path")


def test_stat_make_dir_move_metadata(shared: Sandbox) -> None:
    assert shared.files.make_dir("/root/sm/a/b") is True
    assert shared.files.make_dir("/root/sm/a/b") is False  # a directory already
    shared.files.write("/root/sm/f", "hello", metadata={"Owner.Team": "blue", "k": "v"})
    st = shared.files.stat("/root/sm/f")
    assert (st.path, st.type, st.size, st.permissions, st.owner, st.group, st.uid) == (
        "/root/sm/f", "file", 5, "-rw-r--r--", "root", "root", 0)
    assert st.metadata == {"owner.team": "blue", "k": "v"}  # header names: lower case
    with pytest.raises(ConflictError):
        shared.files.make_dir("/root/sm/f")
    moved = shared.files.move("/root/sm/f", "/root/sm/new/g")
    assert (moved.path, moved.size, moved.metadata) == ("/root/sm/new/g", 5, {"owner.team": "blue", "k": "v"})
    assert not shared.files.exists("/root/sm/f") and shared.files.exists("/root/sm/new/g")
    with pytest.raises(NotFoundError):
        shared.files.move("/root/sm/f", "/root/sm/h")
    shared.commands.run("ln -s g /root/sm/new/l")
    link = shared.files.stat("/root/sm/new/l")
    assert (link.type, link.target) == ("symlink", "g")
    shared.files.write("/root/sm/owned", "x", owner="nobody")
    assert shared.files.stat("/root/sm/owned").owner == "nobody"
    # The sandbox's /tmp (a tmpfs of its kernel) has no user extended attributes.
    with pytest.raises(FailedPreconditionError):
        shared.files.write("/tmp/sm-md", "x", metadata={"k": "v"})


def test_watch(shared: Sandbox) -> None:
    shared.files.make_dir("/root/wt/sub")
    with shared.files.watch("/root/wt", recursive=True) as w:
        shared.commands.run("cd /root/wt && echo hi > a && mkdir sub/new && echo x > sub/new/b && rm a")
        seen = []
        for ev in w:
            seen.append((ev.type, ev.name))
            if (ev.type, ev.name) == ("remove", "a"):
                break
        assert ("create", "a") in seen and ("create", "sub/new") in seen and ("create", "sub/new/b") in seen
        assert seen.index(("create", "a")) < seen.index(("remove", "a"))
    with shared.files.watch("/root/wt/sub") as w:
        shared.commands.run("rmdir /root/wt/sub/new; rm -r /root/wt/sub")
        events = [(ev.type, ev.name) for ev in w]  # ends with the directory's own removal
        assert events[-1] == ("remove", ".")
    with pytest.raises(NotFoundError):
        shared.files.watch("/root/wt/nope")

"""Snapshot before a risky step and roll back after a mistake."""
from space_sdk import Sandbox

with Sandbox.create() as sb:
    sb.files.write("/work/report.md", "# results\nall good\n")
    snap = sb.snapshot()
    sb.commands.run("rm -rf /work")  # the mistake
    assert not sb.files.exists("/work/report.md")
    sb.restore(snap.id)              # memory, processes and disk as they were
    print(sb.files.read_text("/work/report.md"), end="")
    assert sb.files.read_text("/work/report.md") == "# results\nall good\n"
    sb.space.snapshots.delete(snap.id)

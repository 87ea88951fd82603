// Snapshot before a risky step and roll back after a mistake.
import assert from "node:assert/strict";
import { Sandbox } from "space-sdk";

const sb = await Sandbox.create();
try {
  await sb.files.write("/work/report.md", "# results\nall good\n");
  const snap = await sb.snapshot();
  await sb.commands.run("rm -rf /work"); // the mistake
  assert.equal(await sb.files.exists("/work/report.md"), false);
  await sb.restore(snap.id); // memory, processes and disk as they were
  const report = await sb.files.readText("/work/report.md");
  process.stdout.write(report);
  assert.equal(report, "# results\nall good\n");
  await sb.space.snapshots.delete(snap.id);
} finally {
  await sb.kill();
}

// Prepare a sandbox once, fork it, and try two approaches side by side.
import assert from "node:assert/strict";
import { Sandbox } from "space-sdk";

const sb = await Sandbox.create();
const numbers = Array.from({ length: 100000 }, (_, i) => 100000 - i).join("\n");
try {
  await sb.files.write("/work/numbers.txt", numbers);
  const [a, b] = await sb.fork(2); // two running copies, files and processes included
  try {
    const [py, sh] = await Promise.all([
      a.commands.runCode("print(sum(sorted(int(l) for l in open('/work/numbers.txt'))[:10]))"),
      b.commands.run("sort -n /work/numbers.txt | head -10 | awk '{s += $1} END {print s}'"),
    ]);
    console.log("python:", py.stdout.trim(), " shell:", sh.stdout.trim());
    assert.ok(py.stdout.trim() === "55" && sh.stdout.trim() === "55");
  } finally {
    await Promise.all([a.kill(), b.kill()]);
  }
} finally {
  await sb.kill();
}

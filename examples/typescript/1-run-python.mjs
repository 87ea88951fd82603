// Run Python in a sandbox and read the result.
import assert from "node:assert/strict";
import { Sandbox } from "space-sdk";

const sb = await Sandbox.create();
try {
  const result = await sb.commands.runCode("import math; print(math.factorial(20))");
  process.stdout.write(result.stdout);
  assert.equal(result.stdout, "2432902008176640000\n");
} finally {
  await sb.kill();
}

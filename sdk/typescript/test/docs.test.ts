// docs/sdk-typescript.md's runnable examples and examples/typescript/*.mjs:
// each must run to exit 0 against the test server. A fenced block whose
// info string is exactly `js run` is a complete ES module; it is written to
// a temp file and run with `space-sdk` resolving to this checkout's build.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import { skip } from "./helpers.js";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "..");
const ROOT = join(PKG, "../..");
const HOOK = join(PKG, "test/resolve-space-sdk.mjs");

/** runBlocks returns the `js run` blocks of a Markdown document with their line numbers. */
export function runBlocks(md: string): { line: number; code: string }[] {
  const blocks: { line: number; code: string }[] = [];
  const lines = md.split("\n");
  for (let i = 0; i < lines.length; i++) {
    if (lines[i] !== "```js run") continue;
    const start = i + 1;
    let j = start;
    while (j < lines.length && lines[j] !== "```") j++;
    blocks.push({ line: start, code: lines.slice(start, j).join("\n") + "\n" });
    i = j;
  }
  return blocks;
}

function runNode(file: string): void {
  const r = spawnSync(process.execPath, ["--import", HOOK, file], { encoding: "utf8", timeout: 300_000, env: process.env });
  assert.equal(r.status, 0, `node ${file} exited ${r.status} (${r.signal ?? "no signal"}):\n${r.stdout}\n${r.stderr}`);
}

const doc = readFileSync(join(ROOT, "docs/sdk-typescript.md"), "utf8");
const blocks = runBlocks(doc);
const dir = mkdtempSync(join(tmpdir(), "space-sdk-docs-"));
after(() => rmSync(dir, { recursive: true, force: true }));

test("docs/sdk-typescript.md has runnable blocks", () => {
  assert.ok(blocks.length >= 3, `${blocks.length} js run blocks`);
});

for (const b of blocks) {
  test(`docs/sdk-typescript.md:${b.line} runs`, { skip }, () => {
    const file = join(dir, `block-${b.line}.mjs`);
    writeFileSync(file, b.code);
    runNode(file);
  });
}

const examples = join(ROOT, "examples/typescript");
for (const name of readdirSync(examples).filter((n) => n.endsWith(".mjs")).sort()) {
  test(`examples/typescript/${name} runs`, { skip }, () => runNode(join(examples, name)));
}

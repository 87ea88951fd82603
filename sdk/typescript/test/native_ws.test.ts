// Background commands and the PTY through globalThis.WebSocket instead of
// the ws package (Node 22+; run-tests.sh passes --experimental-websocket
// to older Nodes).

import assert from "node:assert/strict";
import { test } from "node:test";
import { Space } from "space-sdk";
import { skip as noServer, useServer } from "./helpers.js";

const { shared } = useServer({ shared: true });
const skip = noServer || (typeof (globalThis as { WebSocket?: unknown }).WebSocket !== "function" && "no globalThis.WebSocket in this Node");

test("background command and PTY over the native WebSocket", { skip }, async () => {
  const native = new Space({ webSocket: "native" });
  const sb = native.sandboxes.connect(shared().id);
  const h = await sb.commands.run("read a; echo got:$a; exit 3", { background: true });
  await h.sendStdin("x\n");
  const r = await h.wait({ timeoutMs: 30_000 });
  assert.deepEqual([r.stdout, r.exitCode], ["got:x\n", 3]);
  const t = await sb.pty.create({ cmd: ["/bin/sh", "-c", "stty size"], cols: 90, rows: 30 });
  const tr = await t.wait({ timeoutMs: 30_000 });
  assert.match(Buffer.from(tr.stdoutBytes).toString(), /30 90/);
  await native.close();
});

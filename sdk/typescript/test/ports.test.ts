// Exposed ports: probe, wait, and HTTP requests to a server in the sandbox.

import assert from "node:assert/strict";
import { test } from "node:test";
import { TimeoutError, UnavailableError } from "space-sdk";
import { skip, useServer } from "./helpers.js";

const { shared } = useServer({ shared: true });

test("ports reach a guest server", { skip }, async () => {
  const sb = shared();
  assert.equal(await sb.ports.isOpen(8000), false);
  await sb.files.write("/srv/www/hello.txt", "hello through the gateway\n");
  const h = await sb.commands.run("python3 -m http.server 8000 --directory /srv/www", { background: true });
  await h.disconnect();
  await sb.ports.waitOpen(8000, { timeoutMs: 60_000 });
  assert.equal(await sb.portOpen(8000), true);

  const r = await sb.ports.fetch(8000, "/hello.txt");
  assert.deepEqual([r.status, await r.text()], [200, "hello through the gateway\n"]);
  assert.equal(r.headers.get("Space-Port"), "8000");
  // The guest's own errors come back as answers, not exceptions.
  const missing = await sb.ports.fetch(8000, "/missing?x=1");
  assert.equal(missing.status, 404);
  await missing.body?.cancel();
  const post = await sb.ports.fetch(8000, "hello.txt", { method: "POST", body: "x", headers: { "Content-Type": "text/plain" } });
  assert.equal(post.status, 501);
  await post.body?.cancel();
  // SPACE's own refusal (nothing listens on 8001) throws.
  await assert.rejects(sb.ports.fetch(8001, "/"), UnavailableError);
  await assert.rejects(sb.ports.waitOpen(8001, { timeoutMs: 500 }), TimeoutError);
  await assert.rejects(sb.ports.fetch(70000), RangeError);
});

// Keep a server running in a sandbox and fetch from it through an exposed port.
import assert from "node:assert/strict";
import { Sandbox } from "space-sdk";

const sb = await Sandbox.create();
try {
  await sb.files.write("/srv/index.html", "<h1>served from a micro-VM</h1>\n");
  await (await sb.commands.run("python3 -m http.server 8080 -d /srv", { background: true })).disconnect();
  await sb.ports.waitOpen(8080);
  const page = await sb.ports.fetch(8080, "/index.html");
  const text = await page.text();
  console.log(page.status, text.trim());
  assert.ok(page.ok && text.includes("micro-VM"));
} finally {
  await sb.kill();
}

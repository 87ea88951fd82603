// Sandbox lifecycle: create with every field, get/list with filters,
// timeout, network, secrets, pause/resume, suspend/resume, async dispose.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";
import { ConflictError, NotFoundError, Sandbox } from "space-sdk";
import { LABELS, sandboxArgs, skip, sleep, useServer } from "./helpers.js";

const { space } = useServer();

test("create with every field, then get and list", { skip }, async () => {
  const secret = "sdk_" + randomBytes(4).toString("hex");
  await space.secrets.create(secret, "s3cr3t", ["api.example.com"], { header: "Authorization", format: "Bearer {}" });
  let id = "";
  try {
    await using sb = await space.sandboxes.create({
      template: "default",
      vcpus: 1,
      memoryMib: 256,
      diskMib: 1024,
      timeoutMs: 900_000,
      onTimeout: "delete",
      env: { GREETING: "hi" },
      labels: { ...LABELS, case: "every-field" },
      network: { allow: ["example.com:443"], max_connections: 16 },
      secrets: [secret],
      checkpoints: { every: "1h", keep: 3 },
      coldBoot: false,
    });
    id = sb.id;
    const info = sb.info!;
    assert.equal(info.state, "running");
    assert.deepEqual([info.template, info.vcpus, info.memory_mib, info.disk_mib], ["default", 1, 256, 1024]);
    assert.ok(info.on_timeout === "delete" && info.expires_at);
    assert.deepEqual(info.env, { GREETING: "hi" });
    assert.equal(sb.labels.case, "every-field");
    assert.ok(info.network?.allow?.includes("example.com:443"));
    assert.ok(info.network?.allow?.includes("api.example.com:443"), "a secret's host is allowed");
    assert.deepEqual(info.secrets, [secret]);
    assert.ok(["1h", "1h0m0s"].includes(info.checkpoints?.every ?? "") && info.checkpoints?.keep === 3);
    const r = await sb.commands.run(`echo $GREETING; test -n "$${secret.toUpperCase()}" && echo has-placeholder`);
    assert.equal(r.stdout, "hi\nhas-placeholder\n");

    const got = await space.sandboxes.get(sb.id);
    assert.equal(got.id, sb.id);
    assert.equal(got.labels.case, "every-field");
    const ids = async (f: Parameters<typeof space.sandboxes.list>[0]) => (await space.sandboxes.list(f)).map((s) => s.id);
    assert.deepEqual(await ids({ labels: { case: "every-field", ...LABELS } }), [sb.id]);
    assert.ok((await ids({ state: "running" })).includes(sb.id));
    assert.ok((await ids({ state: ["paused", "running"] })).includes(sb.id));
    assert.ok(!(await ids({ state: "paused" })).includes(sb.id));
    assert.deepEqual(await ids({ labels: { case: "no-such-label" } }), []);

    // The network policy and the secret grants change in place.
    await sb.setNetwork(["pypi.org:443"]);
    assert.deepEqual(sb.info?.network?.allow, ["pypi.org:443"]);
    await sb.setNetwork({ off: true });
    assert.equal(sb.info?.network?.off, true);
    await sb.setSecrets([]);
    assert.ok(!sb.info?.secrets?.length);
    assert.ok(Array.isArray(await sb.egressLog()));
  } finally {
    await space.secrets.delete(secret);
  }
  await assert.rejects(space.sandboxes.get(id), NotFoundError, "await using deleted it");
});

test("setTimeout expires the sandbox", { skip }, async () => {
  const sb = await space.sandboxes.create(sandboxArgs());
  const before = sb.info?.expires_at;
  await sb.setTimeout(3000);
  assert.notEqual(sb.info?.expires_at, before);
  const deadline = Date.now() + 60_000;
  for (;;) {
    try {
      if (["stopping", "deleted", "stopped"].includes((await sb.refresh()).state)) break;
    } catch (err) {
      if (err instanceof NotFoundError) break;
      throw err;
    }
    assert.ok(Date.now() < deadline, "the sandbox did not expire 3 s after setTimeout(3000)");
    await sleep(1000);
  }
});

test("pause, resume, suspend, resume", { skip }, async () => {
  await using sb = await space.sandboxes.create(sandboxArgs());
  await sb.commands.run("echo kept > /tmp/state");
  assert.equal((await sb.pause()).state, "paused");
  assert.equal((await sb.pause()).state, "paused"); // a no-op
  await assert.rejects(sb.commands.run("true"), ConflictError); // no commands while paused
  assert.equal((await sb.resume()).state, "running");
  assert.equal(await sb.files.readText("/tmp/state"), "kept\n");

  const h = await sb.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.2; done", { background: true });
  await h.disconnect();
  await sleep(1000);
  await sb.suspend();
  assert.ok(sb.state === "suspended" && sb.info?.suspended_snapshot);
  await assert.rejects(sb.files.read("/tmp/counter"), ConflictError);
  assert.equal((await sb.resume()).state, "running");
  const a = Number(await sb.files.readText("/tmp/counter"));
  assert.ok(a > 0, "the disk survives the suspend");
  if (sb.info?.vm?.vmm !== "fake") {
    await sleep(1000);
    const b = Number(await sb.files.readText("/tmp/counter"));
    assert.ok(b > a, "the process runs on after the resume");
    assert.ok((await sb.commands.list()).some((p) => p.id === h.pid && p.running));
  }
});

test("Sandbox.create, await using, kill and delete", { skip }, async () => {
  let id: string;
  {
    await using sb = await Sandbox.create(sandboxArgs());
    id = sb.id;
    assert.ok((await sb.commands.run("true")).ok);
  }
  await assert.rejects(space.sandboxes.get(id), NotFoundError);
  const sb = space.sandboxes.connect(id);
  await sb.delete({ missingOk: true }); // gone already: fine
  await assert.rejects(sb.kill(), NotFoundError);
});

test("metrics: the usage history fills as the worker samples", { skip }, async () => {
  await using sb = await space.sandboxes.create(sandboxArgs());
  let m = await sb.metrics();
  for (let i = 0; i < 60 && m.samples.length === 0; i++) {
    await sleep(1000);
    m = await sb.metrics();
  }
  assert.equal(m.sandbox_id, sb.id);
  assert.ok(m.interval_seconds > 0 && m.samples.length > 0, JSON.stringify(m));
  const last = m.samples[m.samples.length - 1];
  assert.ok(last.cpu_used_pct >= 0 && last.cpu_used_pct <= 100, JSON.stringify(last));
  assert.deepEqual((await sb.metrics({ start: 0, end: 1 })).samples, []);
  assert.ok((await sb.metrics({ start: new Date(Date.now() - 3600_000) })).samples.length > 0);
});

// snapshot, restore, fork, create fromSnapshot, checkpoints; snapshots list/get/delete.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";
import { ConflictError, NotFoundError } from "space-sdk";
import { sandboxArgs, skip, useServer } from "./helpers.js";

const { space, shared } = useServer({ shared: true });

test("snapshot and restore", { skip }, async () => {
  const sb = shared();
  const name = "sdk-" + randomBytes(4).toString("hex");
  await sb.files.write("/root/marker", "before");
  const snap = await sb.snapshot(name);
  try {
    assert.ok(snap.name === name && snap.sandbox_id === sb.id && snap.id.startsWith("snp_"));
    assert.equal((await space.snapshots.get(name)).id, snap.id);
    assert.ok((await space.snapshots.list({ sandbox: sb.id })).some((s) => s.id === snap.id));
    await assert.rejects(sb.snapshot(name), ConflictError); // names are unique in the team
    await sb.files.write("/root/marker", "after");
    assert.equal((await sb.restore(name)).state, "running");
    assert.equal(await sb.files.readText("/root/marker"), "before");
  } finally {
    await space.snapshots.delete(snap.id);
  }
  await assert.rejects(space.snapshots.get(snap.id), NotFoundError);
});

test("fork, and create from a snapshot", { skip }, async () => {
  const sb = shared();
  await sb.files.write("/root/who", "parent");
  const [child] = await sb.fork(1);
  try {
    assert.ok(child && child.id !== sb.id && child.state === "running");
    assert.equal(await child.files.readText("/root/who"), "parent");
    await child.files.write("/root/who", "child");
    assert.equal(await sb.files.readText("/root/who"), "parent", "the copy has its own disk");
  } finally {
    await child?.delete();
  }
  const snap = await sb.snapshot();
  try {
    await using copy = await space.sandboxes.create({ fromSnapshot: snap.id, labels: sandboxArgs().labels! });
    assert.equal(await copy.files.readText("/root/who"), "parent");
  } finally {
    await space.snapshots.delete(snap.id);
  }
});

test("checkpoints: take, list, policy, restore", { skip }, async () => {
  const sb = shared();
  await sb.files.write("/root/cp", "one");
  const cp = await sb.checkpoint();
  assert.ok(cp.id && cp.sandbox_id === sb.id && cp.trigger === "manual");
  const list = await sb.checkpoints();
  assert.ok(list.checkpoints.some((c) => c.id === cp.id));
  await sb.setCheckpointPolicy({ every: "2h", keep: 2 });
  assert.ok(["2h", "2h0m0s"].includes(sb.info?.checkpoints?.every ?? ""));
  await sb.files.write("/root/cp", "two");
  await sb.restore({ checkpoint: cp.id });
  assert.equal(await sb.files.readText("/root/cp"), "one");
});

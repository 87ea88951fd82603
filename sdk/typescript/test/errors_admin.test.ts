// Every typed error, and the management API: templates (with a build),
// API keys, quota, secrets, workers.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";
import {
  AuthenticationError,
  ConflictError,
  FailedPreconditionError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  QuotaExceededError,
  RequestTooLargeError,
  Space,
  SpaceError,
  TemplateBuildError,
  UnavailableError,
  tar,
  type BuildEvent,
} from "space-sdk";
import { sandboxArgs, skip, useServer } from "./helpers.js";

const { space, shared } = useServer({ shared: true });

test("404 not_found", { skip }, async () => {
  await assert.rejects(space.sandboxes.get("sbx_doesnotexist"), (e: unknown) => {
    assert.ok(e instanceof NotFoundError);
    assert.deepEqual([e.code, e.status], ["not_found", 404]);
    assert.match(e.message, /not found/);
    return true;
  });
  await assert.rejects(shared().commands.get(987654), NotFoundError);
  await assert.rejects(shared().commands.connect(987654), NotFoundError);
  await assert.rejects(space.snapshots.get("no-such-snapshot"), NotFoundError);
  await assert.rejects(space.apiKeys.delete("key_doesnotexist"), NotFoundError);
});

test("400 invalid_argument names the field", { skip }, async () => {
  const field = async (p: Promise<unknown>) => {
    try {
      await p;
    } catch (e) {
      assert.ok(e instanceof InvalidArgumentError, String(e));
      assert.equal(e.status, 400);
      return e.field;
    }
    assert.fail("no error");
  };
  assert.equal(await field(space.sandboxes.create(sandboxArgs({ memoryMib: 1 }))), "memory_mib");
  assert.equal(await field(space.sandboxes.create(sandboxArgs({ template: "no-such-template" }))), "template");
  assert.equal(await field(shared().setTimeout(1e12)), "timeout_seconds");
  await field(shared().setNetwork(["not a rule!"]));
});

test("409 conflict and failed_precondition", { skip }, async () => {
  await assert.rejects(space.templates.delete("default"), (e: unknown) => {
    assert.ok(e instanceof FailedPreconditionError && e instanceof ConflictError);
    assert.equal(e.status, 409);
    return true;
  });
  await assert.rejects(shared().files.write("/tmp", "x"), ConflictError);
});

test("401 unauthenticated", { skip }, async () => {
  const bad = new Space({ apiKey: "not-a-key" });
  assert.equal((await bad.health()).status, "ok"); // needs no key
  await assert.rejects(bad.sandboxes.list(), (e: unknown) => {
    assert.ok(e instanceof AuthenticationError);
    assert.deepEqual([e.code, e.status], ["unauthenticated", 401]);
    return true;
  });
});

test("413 request_too_large", { skip }, async () => {
  const env = { BIG: "x".repeat(2 << 20) }; // a JSON body above the server's 1 MiB
  await assert.rejects(space.sandboxes.create(sandboxArgs({ env })), (e: unknown) => {
    assert.ok(e instanceof RequestTooLargeError, String(e));
    assert.deepEqual([e.code, e.status], ["request_too_large", 413]);
    return true;
  });
});

test("503 unavailable: nothing listens on the port", { skip }, async () => {
  await assert.rejects(shared().ports.fetch(8009, "/"), (e: unknown) => {
    assert.ok(e instanceof UnavailableError, String(e));
    assert.equal(e.status, 503);
    return true;
  });
});

test("a team key: 429 quota, 403 permission, keys, quota", { skip }, async () => {
  const team = "sdk-" + randomBytes(4).toString("hex");
  const key = await space.apiKeys.create("sdk-test", { team });
  assert.ok(key.secret && key.team === team && !key.admin);
  try {
    assert.ok((await space.apiKeys.list({ team })).some((k) => k.id === key.id));
    const usage = await space.quota.set({ team, sandboxes: 1, vcpus: 1, memoryMib: 128, snapshotMib: 0 });
    assert.equal(usage.limits.memory_mib, 128);
    assert.equal((await space.quota.get({ team })).limits.sandboxes, 1);
    const tk = new Space({ apiKey: key.secret });
    const q = await tk.quota.get();
    assert.ok(q.limits.memory_mib === 128 && q.used.sandboxes === 0);
    await assert.rejects(tk.sandboxes.create(sandboxArgs()), (e: unknown) => {
      assert.ok(e instanceof QuotaExceededError, String(e)); // 256 MiB > 128
      assert.deepEqual([e.code, e.status], ["resource_exhausted", 429]);
      return true;
    });
    await assert.rejects(tk.apiKeys.create(undefined, { team: "someone-else" }), PermissionDeniedError);
    await assert.rejects(tk.quota.set({ sandboxes: 100 }), (e: unknown) => {
      assert.ok(e instanceof PermissionDeniedError);
      assert.deepEqual([e.code, e.status], ["permission_denied", 403]);
      return true;
    });
    await assert.rejects(tk.workers.list(), PermissionDeniedError);
    assert.deepEqual(await tk.sandboxes.list(), [], "a team sees only its own sandboxes");
  } finally {
    await space.apiKeys.delete(key.id, { team });
  }
  await assert.rejects(new Space({ apiKey: key.secret }).sandboxes.list(), AuthenticationError);
});

test("workers (admin)", { skip }, async () => {
  const ws = await space.workers.list();
  assert.ok(ws.length >= 1 && ws.every((w) => w.id));
});

test("templates: list, get, build with events, delete", { skip }, async () => {
  const tpls = await space.templates.list();
  const def = tpls.filter((t) => t.default);
  assert.ok(def.length === 1 && def[0]!.state === "ready");
  assert.deepEqual((await space.templates.get(def[0]!.name)).map((t) => t.name), [def[0]!.name]);
  await assert.rejects(space.templates.get("no-such-template"), NotFoundError);

  const name = "sdk-" + randomBytes(4).toString("hex");
  const events: BuildEvent[] = [];
  const context = tar([
    { name: "space.yaml", data: `name: ${name}\nbase: {dir: root}\nresources: {memory_mib: 256}\n` },
    { name: "root/srv/hello.txt", data: "from the template\n" },
  ]);
  const { template, report } = await space.templates.build(context, { onEvent: (ev) => void events.push(ev) });
  try {
    assert.deepEqual([template.name, template.version, template.state], [name, 1, "ready"]);
    assert.ok(events.some((e) => e.type === "phase") && events.at(-1)?.type === "done", JSON.stringify(events));
    assert.equal(report.snapshots, 1);
    assert.deepEqual((await space.templates.get(name)).map((t) => t.version), [1]);
    assert.ok((await space.templates.list()).some((t) => t.name === name));
  } finally {
    await space.templates.delete(name);
  }
  await assert.rejects(space.templates.get(name), NotFoundError);
});

test("template build errors", { skip }, async () => {
  await assert.rejects(space.templates.build(new TextEncoder().encode("this is not a tar archive"), { name: "sdk-bad" }), (e: unknown) => {
    assert.ok(e instanceof InvalidArgumentError);
    assert.equal(e.field, "context");
    return true;
  });
  const spec = "name: sdk-bad\nbase: {}\nsteps: [{nonsense: 1}]\n";
  await assert.rejects(space.templates.build(tar([{ name: "space.yaml", data: spec }])), (e: unknown) => {
    assert.ok(e instanceof SpaceError && ["invalid_argument", "failed_precondition"].includes(e.code), String(e));
    return true;
  });
  // A step that fails: the build stream ends with an error event and its report.
  const failing = "name: sdk-fail\nbase: {dir: root}\nsteps: [{run: [/nonexistent]}]\nresources: {memory_mib: 256}\n";
  await assert.rejects(space.templates.build(tar([{ name: "space.yaml", data: failing }, { name: "root/x", data: "x" }])), (e: unknown) => {
    assert.ok(e instanceof TemplateBuildError, String(e));
    return true;
  }).finally(() => space.templates.delete("sdk-fail").catch(() => {}));
});

test("secrets", { skip }, async () => {
  const name = "sdk_" + randomBytes(4).toString("hex");
  const s = await space.secrets.create(name, new TextEncoder().encode("v"), ["api.example.com"]);
  try {
    assert.ok(s.name === name && s.hosts.join() === "api.example.com");
    assert.ok((await space.secrets.list()).some((x) => x.name === name));
    await assert.rejects(space.secrets.create(name, "v", ["api.example.com"]), ConflictError);
  } finally {
    await space.secrets.delete(name);
  }
  await assert.rejects(space.secrets.delete(name), NotFoundError);
});

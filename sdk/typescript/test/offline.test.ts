// Offline tests: error mapping, the retry rule, data-plane routing, NDJSON
// parsing, tar, and the generated types' drift. They need no SPACE server.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
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
  StreamCutError,
  UnavailableError,
  errorFromResponse,
  makeError,
  tar,
  untar,
} from "space-sdk";

const PKG = join(dirname(fileURLToPath(import.meta.url)), "..");

type Handler = (req: IncomingMessage, body: string, res: ServerResponse) => void;

/** serve runs a local HTTP server answering with handler; it returns its URL and a stop function. */
async function serve(handler: Handler): Promise<{ url: string; stop: () => Promise<void> }> {
  const srv = createServer((req, res) => {
    let body = "";
    req.on("data", (c: Buffer) => (body += c.toString()));
    req.on("end", () => handler(req, body, res));
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  return { url, stop: () => new Promise((r) => srv.close(() => r())) };
}

function errorBody(code: string, message: string, field?: string): string {
  return JSON.stringify({ error: { code, message, ...(field ? { field } : {}) } });
}

test("error codes map to classes", () => {
  const cases: [number, string, Function][] = [
    [400, "invalid_argument", InvalidArgumentError],
    [401, "unauthenticated", AuthenticationError],
    [403, "permission_denied", PermissionDeniedError],
    [404, "not_found", NotFoundError],
    [409, "conflict", ConflictError],
    [409, "failed_precondition", FailedPreconditionError],
    [413, "request_too_large", RequestTooLargeError],
    [429, "resource_exhausted", QuotaExceededError],
    [503, "unavailable", UnavailableError],
    [503, "resource_exhausted", UnavailableError],
  ];
  for (const [status, code, cls] of cases) {
    const e = errorFromResponse(status, errorBody(code, "m", "f"));
    assert.ok(e instanceof cls, `errorFromResponse(${status}, ${code}) = ${e.name}, want ${cls.name}`);
    assert.ok(e instanceof SpaceError);
    assert.deepEqual([e.code, e.message, e.field, e.status], [code, "m", "f", status]);
  }
  assert.ok(makeError("failed_precondition", "x") instanceof ConflictError);
  // A body that is not an Error (a proxy's page): the code comes from the status.
  const e = errorFromResponse(502, "<html>bad gateway</html>");
  assert.ok(e instanceof UnavailableError);
  assert.equal(e.message, "<html>bad gateway</html>");
  assert.equal(errorFromResponse(418, "").code, "internal");
  assert.match(String(errorFromResponse(400, errorBody("invalid_argument", "too small", "memory_mib"))), /memory_mib: too small \(invalid_argument, HTTP 400\)/);
});

test("idempotent requests retry 429/503 honouring Retry-After; creates never retry", async () => {
  const hits: Record<string, number> = {};
  const srv = await serve((req, _body, res) => {
    const k = `${req.method} ${req.url}`;
    hits[k] = (hits[k] ?? 0) + 1;
    if (hits[k] === 1) {
      res.writeHead(503, { "Content-Type": "application/json", "Retry-After": "0" });
      res.end(errorBody("unavailable", "busy"));
      return;
    }
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ status: "ok", version: "t", sandboxes: [] }));
  });
  try {
    const space = new Space({ apiUrl: srv.url, apiKey: "k" });
    assert.equal((await space.health()).status, "ok");
    assert.equal(hits["GET /v1/health"], 2);
    await space.sandboxes.list();
    assert.equal(hits["GET /v1/sandboxes"], 2);
    await assert.rejects(space.sandboxes.create({}), UnavailableError);
    assert.equal(hits["POST /v1/sandboxes"], 1, "a create is never retried");
    // maxRetries 0: the first 503 is the answer.
    const once = new Space({ apiUrl: srv.url, apiKey: "k", maxRetries: 0 });
    await assert.rejects(once.snapshots.get("s"), UnavailableError);
  } finally {
    await srv.stop();
  }
});

test("data-plane requests go to the data plane and refetch the token once on 401", async () => {
  const seen: string[] = [];
  let token = 0;
  const srv = await serve((req, _body, res) => {
    const auth = req.headers.authorization ?? "";
    seen.push(`${req.method} ${req.url} ${auth}`);
    if (req.url === "/v1/sandboxes/sbx_1") {
      token++;
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({
        id: "sbx_1", team: "t", state: "running",
        data_plane: { url: `${srv.url}/dp`, token: `sdp1_${token}`, expires_at: new Date(Date.now() + 3600e3).toISOString() },
      }));
      return;
    }
    if (req.url?.startsWith("/dp/v1/sandboxes/sbx_1/processes")) {
      if (auth !== "Bearer sdp1_2") {
        res.writeHead(401, { "Content-Type": "application/json" });
        res.end(errorBody("unauthenticated", "token expired"));
        return;
      }
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ processes: [] }));
      return;
    }
    res.writeHead(404).end();
  });
  try {
    const space = new Space({ apiUrl: srv.url, apiKey: "apikey" });
    const sb = space.sandboxes.connect("sbx_1");
    assert.deepEqual(await sb.commands.list(), []);
    assert.deepEqual(seen, [
      "GET /v1/sandboxes/sbx_1 Bearer apikey",
      "GET /dp/v1/sandboxes/sbx_1/processes Bearer sdp1_1",
      "GET /v1/sandboxes/sbx_1 Bearer apikey",
      "GET /dp/v1/sandboxes/sbx_1/processes Bearer sdp1_2",
    ]);
  } finally {
    await srv.stop();
  }
});

test("NDJSON output streams: split lines, callbacks, exit, error and cut", async () => {
  const b64 = (s: string) => Buffer.from(s).toString("base64");
  const lines = [
    { type: "started", process: { id: 7, pid: 70, started_at: "", running: true, attached: true, dropped_bytes: 0 } },
    { type: "stdout", data: b64("hé") },
    { type: "stderr", data: b64("oops\n") },
    { type: "stdout", data: b64("llo\n") },
    { type: "exit", exit: { code: 3 } },
  ].map((l) => JSON.stringify(l) + "\n").join("");
  // Send it in awkward pieces: across lines and inside a UTF-8 sequence.
  const srv = await serve((req, _body, res) => {
    res.writeHead(200, { "Content-Type": "application/x-ndjson" });
    const bytes = Buffer.from(req.url!.includes("cut") ? lines.slice(0, 150) : req.url!.includes("err")
      ? JSON.stringify({ type: "error", error: { code: "failed_precondition", message: "not running" } }) + "\n"
      : lines);
    let i = 0;
    const next = () => {
      if (i >= bytes.length) {
        if (req.url!.includes("cut")) res.socket?.destroy();
        else res.end();
        return;
      }
      res.write(bytes.subarray(i, i + 17));
      i += 17;
      setImmediate(next);
    };
    next();
  });
  try {
    const space = new Space({ apiUrl: srv.url, apiKey: "k" });
    const got: string[] = [];
    const r = await space.sandboxes.connect("sbx_x").commands.output(1, { onStdout: (s) => void got.push(s) });
    assert.deepEqual([r.stdout, r.stderr, r.exitCode, r.pid, r.ok], ["héllo\n", "oops\n", 3, 7, false]);
    assert.equal(got.join(""), "héllo\n");
    await assert.rejects(space.sandboxes.connect("sbx_cut").commands.output(1), StreamCutError);
    await assert.rejects(space.sandboxes.connect("sbx_err").commands.output(1), FailedPreconditionError);
  } finally {
    await srv.stop();
  }
});

test("tar writes what untar reads, long names included", () => {
  const long = "d/" + "x".repeat(150) + ".txt";
  const files = untar(tar([{ name: "a.txt", data: "A" }, { name: "d" }, { name: long, data: new Uint8Array([0, 255]) }]));
  assert.deepEqual([...files.keys()], ["a.txt", long]);
  assert.equal(Buffer.from(files.get("a.txt")!).toString(), "A");
  assert.deepEqual([...files.get(long)!], [0, 255]);
});

test("untar leaves out names that leave the archive's root", () => {
  const archive = tar([
    { name: "ok.txt", data: "ok" },
    { name: "../escape", data: "x" },
    { name: "/etc/passwd", data: "x" },
    { name: "a/../../up", data: "x" },
    { name: "./sub/in.txt", data: "in" },
  ]);
  assert.deepEqual([...untar(archive).keys()], ["ok.txt", "sub/in.txt"]);
});

test("src/schema.ts is what openapi-typescript makes of api/openapi.yaml", () => {
  const dir = mkdtempSync(join(tmpdir(), "space-sdk-gen-"));
  try {
    const out = join(dir, "schema.ts");
    execFileSync(join(PKG, "node_modules/.bin/openapi-typescript"), ["../../api/openapi.yaml", "--default-non-nullable=false", "-o", out], {
      cwd: PKG,
      stdio: "pipe",
    });
    const want = readFileSync(out, "utf8");
    const got = readFileSync(join(PKG, "src/schema.ts"), "utf8");
    assert.ok(got === want, "src/schema.ts is stale: run `npm run gen` in sdk/typescript and commit it");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("package.json's gen script makes the same file as the drift test", () => {
  const pkg = JSON.parse(readFileSync(join(PKG, "package.json"), "utf8")) as { scripts: Record<string, string> };
  assert.equal(pkg.scripts.gen, "openapi-typescript ../../api/openapi.yaml --default-non-nullable=false -o src/schema.ts");
});

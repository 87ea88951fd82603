// sandbox.files: text, bytes, large streamed transfers, list, remove, makeDir, modes, tar.

import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { createReadStream, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { test } from "node:test";
import { ConflictError, NotFoundError, tar, untar } from "space-sdk";
import { skip, useServer } from "./helpers.js";

const { shared } = useServer({ shared: true });
const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

test("text and bytes", { skip }, async () => {
  const f = shared().files;
  const w = await f.write("/tmp/f/hello.txt", "héllo\n");
  assert.deepEqual([w.path, w.size], ["/tmp/f/hello.txt", 7]);
  assert.equal(await f.readText("/tmp/f/hello.txt"), "héllo\n");
  const blob = new Uint8Array(768).map((_, i) => i % 256);
  await f.write("/tmp/f/blob.bin", blob);
  assert.deepEqual(await f.read("/tmp/f/blob.bin"), blob);
  assert.equal((await shared().commands.run("cat /tmp/f/hello.txt")).stdout, "héllo\n");
  await f.write("/tmp/f/hello.txt", new TextEncoder().encode("new"));
  assert.equal(await f.readText("/tmp/f/hello.txt"), "new");
  await f.write("/tmp/f/blob.txt", new Blob(["from a blob"]));
  assert.equal(await f.readText("/tmp/f/blob.txt"), "from a blob");
});

test("mode and mkdir", { skip }, async () => {
  const f = shared().files;
  await f.write("/tmp/m/a/b/run.sh", "#!/bin/sh\necho ran\n", { mode: 0o755 });
  const info = (await f.list("/tmp/m/a/b")).find((e) => e.name === "run.sh")!;
  assert.deepEqual([info.mode, info.type], [0o755, "file"]);
  assert.equal((await shared().commands.run("/tmp/m/a/b/run.sh")).stdout, "ran\n");
  await assert.rejects(f.write("/tmp/nodir/x/y.txt", "x", { mkdir: false }), NotFoundError);
});

test("large files stream both ways (Node streams and web streams)", { skip }, async () => {
  const f = shared().files;
  const data = randomBytes(24 << 20);
  // A Node stream.Readable of 1 MiB pieces: streamed, not read whole first.
  const pieces = function* () {
    for (let i = 0; i < data.length; i += 1 << 20) yield data.subarray(i, i + (1 << 20));
  };
  const w = await f.write("/tmp/large.bin", Readable.from(pieces()));
  assert.equal(w.size, data.length);
  assert.equal((await shared().commands.run("sha256sum /tmp/large.bin")).stdout.split(" ")[0], sha256(data));
  const stream = await f.readStream("/tmp/large.bin");
  const h = createHash("sha256");
  let n = 0;
  for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) {
    h.update(chunk);
    n += chunk.length;
  }
  assert.deepEqual([n, h.digest("hex")], [data.length, sha256(data)]);
  // A file on disk through fs.createReadStream, and a web ReadableStream back.
  const dir = mkdtempSync(join(tmpdir(), "space-sdk-"));
  try {
    writeFileSync(join(dir, "up.bin"), data.subarray(0, 3 << 20));
    await f.write("/tmp/fromfile.bin", createReadStream(join(dir, "up.bin")));
    assert.equal(sha256(await f.read("/tmp/fromfile.bin")), sha256(data.subarray(0, 3 << 20)));
    await f.write("/tmp/fromweb.bin", (await f.readStream("/tmp/fromfile.bin")));
    assert.equal(sha256(await f.read("/tmp/fromweb.bin")), sha256(data.subarray(0, 3 << 20)));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  await f.remove("/tmp/large.bin");
  await f.remove("/tmp/fromfile.bin");
  await f.remove("/tmp/fromweb.bin");
});

test("list, exists, remove, makeDir", { skip }, async () => {
  const f = shared().files;
  assert.equal(await f.makeDir("/tmp/d1/d2/d3"), true);
  assert.equal(await f.makeDir("/tmp/d1/d2/d3"), false); // exists already: fine
  await f.write("/tmp/d1/f.txt", "x");
  const entries = Object.fromEntries((await f.list("/tmp/d1")).map((e) => [e.name, e.type]));
  assert.deepEqual(entries, { d2: "dir", "f.txt": "file" });
  assert.ok(await f.exists("/tmp/d1/d2/d3"));
  assert.ok(!(await f.exists("/tmp/d1/nope")));
  assert.ok(!(await f.exists("/no/such/dir/x")));
  await f.remove("/tmp/d1/f.txt");
  assert.ok(!(await f.exists("/tmp/d1/f.txt")));
  await assert.rejects(f.remove("/tmp/d1")); // not empty, not recursive
  await f.remove("/tmp/d1", { recursive: true });
  assert.ok(!(await f.exists("/tmp/d1")));
});

test("stat, owner, metadata, move, makeDir conflicts", { skip }, async () => {
  const f = shared().files;
  await f.write("/home/user/s/own.txt", "mine", { owner: "user", metadata: { purpose: "test", "run.id": "7" } });
  const st = await f.stat("/home/user/s/own.txt");
  assert.deepEqual([st.owner, st.group, st.size, st.permissions, st.path], ["user", "user", 4, "-rw-r--r--", "/home/user/s/own.txt"]);
  assert.deepEqual(st.metadata, { purpose: "test", "run.id": "7" });
  assert.equal((await f.stat("/home/user/s")).owner, "user"); // the directory made for it too
  assert.equal(await f.makeDir("/home/user/s/d/e", { owner: "user" }), true);
  assert.equal((await f.stat("/home/user/s/d")).owner, "user");
  await assert.rejects(f.makeDir("/home/user/s/own.txt"), ConflictError);
  const moved = await f.move("/home/user/s/own.txt", "/home/user/s/new/place.txt");
  assert.equal(moved.path, "/home/user/s/new/place.txt");
  assert.equal(await f.readText("/home/user/s/new/place.txt"), "mine");
  await assert.rejects(f.move("/home/user/s/own.txt", "/tmp/x"), NotFoundError);
  await assert.rejects(f.stat("/home/user/nope"), NotFoundError);
  await f.remove("/home/user/s", { recursive: true });
});

test("watch a directory", { skip }, async () => {
  const f = shared().files;
  await f.makeDir("/tmp/w");
  const w = await f.watch("/tmp/w", { recursive: true });
  const seen: string[] = [];
  const done = (async () => {
    for await (const ev of w) {
      seen.push(`${ev.type} ${ev.name}`);
      if (ev.type === "remove" && ev.name === "sub/b") break;
    }
  })();
  await f.write("/tmp/w/a.txt", "a");
  await shared().commands.run("mkdir /tmp/w/sub && echo b > /tmp/w/sub/b && rm /tmp/w/sub/b");
  await done;
  w.close();
  for (const want of ["create a.txt", "create sub", "create sub/b", "remove sub/b"]) {
    assert.ok(seen.includes(want), `${want} in ${JSON.stringify(seen)}`);
  }
  await assert.rejects(f.watch("/tmp/no-such-dir"), NotFoundError);
});

test("tar both ways", { skip }, async () => {
  const f = shared().files;
  await f.write("/tmp/t/a.txt", "A");
  await f.write("/tmp/t/sub/b.txt", "B");
  const archive = await f.readTar("/tmp/t");
  assert.equal(Buffer.from(untar(archive).get("sub/b.txt")!).toString(), "B");
  const tw = await f.writeTar("/tmp/t2", archive);
  assert.equal(tw.bytes, 2);
  assert.equal(await f.readText("/tmp/t2/sub/b.txt"), "B");
  // A stream in, an archive made here, and a stream out.
  await f.writeTar("/tmp/t3", await f.readTarStream("/tmp/t"));
  assert.equal(await f.readText("/tmp/t3/a.txt"), "A");
  await f.writeTar("/tmp/t4", tar([{ name: "x/y.txt", data: "Y" }, { name: "run.sh", data: "#!/bin/sh\n", mode: 0o755 }]));
  assert.equal(await f.readText("/tmp/t4/x/y.txt"), "Y");
  assert.equal((await f.list("/tmp/t4")).find((e) => e.name === "run.sh")!.mode, 0o755);
});

test("file errors", { skip }, async () => {
  const f = shared().files;
  await assert.rejects(f.read("/no/such/file"), (e: unknown) => {
    assert.ok(e instanceof NotFoundError);
    assert.deepEqual([e.status, e.code], [404, "not_found"]);
    return true;
  });
  await assert.rejects(f.list("/no/such/dir"), NotFoundError);
  await assert.rejects(f.write("/tmp", "x"), ConflictError); // a directory
  await assert.rejects(f.read("relative/path"), TypeError);
});

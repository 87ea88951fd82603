// commands.run (streaming, stdin, env/cwd/user/timeout, exit codes, the
// 50 MiB stream), background commands, re-attach, signals and the PTY.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";
import { CommandExitError, Space, TimeoutError } from "space-sdk";
import { skip, sleep, useServer, waitFor } from "./helpers.js";

const { shared } = useServer({ shared: true });
const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

test("run: exit code, stdout and stderr, argv", { skip }, async () => {
  const r = await shared().commands.run("echo out; echo err >&2; exit 3");
  assert.deepEqual([r.stdout, r.stderr, r.exitCode, r.ok], ["out\n", "err\n", 3, false]);
  const a = await shared().commands.run(["printf", "%s|", "a b", "c"]);
  assert.deepEqual([a.stdout, a.exitCode], ["a b|c|", 0]);
});

test("run: callbacks get output as it arrives", { skip }, async () => {
  const got: [number, string, string][] = [];
  const t0 = Date.now();
  const r = await shared().commands.run("echo first; echo e1 >&2; sleep 2; echo second", {
    onStdout: (s) => void got.push([Date.now() - t0, "out", s]),
    onStderr: (s) => void got.push([Date.now() - t0, "err", s]),
  });
  const end = Date.now() - t0;
  assert.equal(got.filter((g) => g[1] === "out").map((g) => g[2]).join(""), "first\nsecond\n");
  assert.equal(got.filter((g) => g[1] === "err").map((g) => g[2]).join(""), "e1\n");
  const first = got.find((g) => g[2].includes("first"))![0];
  assert.ok(first < end - 1500, `the first line came at ${first} ms of ${end}: it must arrive before the command ends`);
  assert.equal(r.stdout, "first\nsecond\n");
});

test("run: bytes are kept exactly", { skip }, async () => {
  const r = await shared().commands.run(["printf", "\\377\\000\\303\\251"]);
  assert.deepEqual([...r.stdoutBytes], [0xff, 0x00, 0xc3, 0xa9]);
  assert.equal(r.stdout, "\ufffd\u0000é");
});

test("run: stdin, env, cwd, user, timeout, check", { skip }, async () => {
  const sb = shared();
  const data = new Uint8Array(256_000).map((_, i) => i % 256);
  assert.equal((await sb.commands.run("sha256sum", { stdin: data })).stdout.split(" ")[0], sha256(data));
  assert.equal((await sb.commands.run("cat", { stdin: "héllo" })).stdout, "héllo");
  assert.equal((await sb.commands.run("cat", { timeoutMs: 20_000 })).exitCode, 0, "no stdin: EOF at once");
  assert.equal((await sb.commands.run('echo "$FOO|$PWD"', { env: { FOO: "bar baz" }, cwd: "/tmp" })).stdout, "bar baz|/tmp\n");
  if (sb.info?.vm?.vmm !== "fake") {
    assert.equal((await sb.commands.run('echo "$(id -un) $(id -u)"', { user: "nobody" })).stdout, "nobody 65534\n");
  }
  const t0 = Date.now();
  const t = await sb.commands.run("sleep 60", { timeoutMs: 2000 });
  assert.ok(t.timedOut && t.exitCode !== 0, `timedOut ${t.timedOut}, exit ${t.exitCode}`);
  assert.ok(Date.now() - t0 < 30_000);
  await assert.rejects(sb.commands.run("echo nope >&2; exit 4", { check: true }), (e: unknown) => {
    assert.ok(e instanceof CommandExitError);
    assert.equal(e.result.exitCode, 4);
    assert.match(e.message, /nope/);
    return true;
  });
  assert.equal((await sb.commands.runCode("print(6*7)")).stdout, "42\n");
});

test("run: 50 MiB of stdout arrive byte-exact", { skip }, async () => {
  const n = 50 << 20;
  let pieces = 0;
  // tee hands the same bytes to sha256sum, whose digest comes on stderr.
  const b = await shared().commands.run(["bash", "-c", `head -c ${n} /dev/urandom | tee >(sha256sum >&2)`], {
    onStdout: () => void pieces++,
  });
  assert.equal(b.exitCode, 0, b.stderr);
  assert.equal(b.stdoutBytes.length, n);
  assert.ok(pieces > 1, "output must stream in several pieces");
  assert.equal(sha256(b.stdoutBytes), b.stderr.split(" ")[0]);
});

test("background: stdin, closeStdin, wait, list", { skip }, async () => {
  const sb = shared();
  const chunks: string[] = [];
  const h = await sb.commands.run("read a; echo got:$a; cat; echo end", { background: true, onStdout: (s) => void chunks.push(s) });
  assert.ok(h.pid > 0 && h.guestPid > 0 && !h.done);
  await h.sendStdin("one\n");
  await h.sendStdin(new TextEncoder().encode("two\n"));
  await h.closeStdin();
  const r = await h.wait({ timeoutMs: 30_000 });
  assert.deepEqual([r.stdout, r.exitCode, r.pid], ["got:one\ntwo\nend\n", 0, h.pid]);
  assert.equal(chunks.join(""), r.stdout);
  const p = (await sb.commands.list()).find((x) => x.id === h.pid);
  assert.ok(p && !p.running && p.exit, "the process is listed as exited");
  // A background command can get its stdin in run's options too.
  const h2 = await sb.commands.run("sha256sum", { background: true, stdin: "abc" });
  assert.equal((await h2.wait()).stdout.split(" ")[0], sha256(new TextEncoder().encode("abc")));
});

test("background: outlives a dropped client and is re-attached", { skip }, async () => {
  const sb = shared();
  const other = new Space(); // a client of its own, closed without detaching: its connection just drops
  const first: string[] = [];
  const h = await other.sandboxes.connect(sb.id).commands.run("echo start; sleep 2; echo detached; sleep 2; echo live; exit 7", {
    background: true,
    onStdout: (s) => void first.push(s),
  });
  const pid = h.pid;
  await waitFor(() => first.join("").includes("start"));
  await other.close();
  await sleep(3000); // "detached" is written while no client is attached
  const p = await sb.commands.get(pid);
  assert.ok(p.running && !p.attached, "the command must outlive its client");
  const h2 = await sb.commands.connect(pid);
  await assert.rejects(h2.wait({ timeoutMs: 10 }), TimeoutError);
  const r = await h2.wait({ timeoutMs: 60_000 });
  assert.equal(r.exitCode, 7);
  assert.equal(r.stdout, "detached\nlive\n", "re-attaching replays what no client received, then live output");
});

test("background: disconnect, then follow the output read-only", { skip }, async () => {
  const sb = shared();
  const h = await sb.commands.run("sleep 1; echo later", { background: true });
  await h.disconnect();
  const r = await sb.commands.output(h.pid);
  assert.deepEqual([r.stdout, r.exitCode], ["later\n", 0]);
});

test("background: a tag, and a second handle that shares the output", { skip }, async () => {
  const sb = shared();
  let out1 = "";
  let out2 = "";
  const h = await sb.commands.run("while read l; do echo \"got $l\"; done", {
    background: true,
    tag: "echoer",
    onStdout: (s) => void (out1 += s),
  });
  assert.equal((await sb.commands.get(h.pid)).tag, "echoer");
  const h2 = await sb.commands.connect(h.pid, { share: true, onStdout: (s) => void (out2 += s) });
  await h.sendStdin("one\n");
  await waitFor(() => out1 === "got one\n" && out2 === "got one\n");
  await h.closeStdin();
  const [r, r2] = await Promise.all([h.wait({ timeoutMs: 30_000 }), h2.wait({ timeoutMs: 30_000 })]);
  assert.deepEqual([r.exitCode, r2.exitCode, r.stdout, r2.stdout], [0, 0, "got one\n", "got one\n"]);
});

test("background: killOnDisconnect", { skip }, async () => {
  const sb = shared();
  const other = new Space();
  const h = await other.sandboxes.connect(sb.id).commands.run("sleep 60", { background: true, killOnDisconnect: true });
  await other.close();
  await waitFor(async () => !(await sb.commands.get(h.pid)).running, 20_000);
});

test("signals: handle.signal, handle.kill, commands.signal", { skip }, async () => {
  const sb = shared();
  const h = await sb.commands.run("trap 'echo TERM; exit 42' TERM; echo ready; while true; do sleep 0.1; done", { background: true });
  await sleep(1000); // let the shell set its trap
  await h.signal(15);
  const r = await h.wait({ timeoutMs: 30_000 });
  assert.ok(r.exitCode === 42 && r.stdout.includes("TERM"), `exit ${r.exitCode}: ${r.stdout}`);
  const h2 = await sb.commands.run("sleep 60", { background: true });
  await h2.kill();
  const r2 = await h2.wait({ timeoutMs: 30_000 });
  assert.ok(r2.signal === 9 || r2.exitCode === 137, `signal ${r2.signal}, exit ${r2.exitCode}`);
  const h3 = await sb.commands.run("sleep 60", { background: true });
  await sb.commands.signal(h3.pid, 15);
  const r3 = await h3.wait({ timeoutMs: 30_000 });
  assert.ok(r3.signal === 15 || r3.exitCode === 143, `signal ${r3.signal}, exit ${r3.exitCode}`);
});

test("pty: input, resize checked with stty size, exit", { skip }, async () => {
  const seen: Uint8Array[] = [];
  const t = await shared().pty.create({ cols: 80, rows: 24, onData: (b) => void seen.push(b) });
  const text = () => Buffer.from(t.output).toString();
  await t.sendInput("stty size; echo pty-$((6*7))\n");
  await waitFor(() => text().includes("pty-42") && text().includes("24 80"));
  await t.resize(100, 40);
  await t.sendInput("stty size\n");
  await waitFor(() => text().includes("40 100"));
  await t.sendInput("exit 5\n");
  const r = await t.wait({ timeoutMs: 30_000 });
  assert.equal(r.exitCode, 5);
  assert.deepEqual(Buffer.concat(seen), Buffer.from(t.output));
  assert.deepEqual(Buffer.from(r.stdoutBytes), Buffer.from(t.output));
  assert.equal(r.stderrBytes.length, 0, "a terminal's output is all stdout");
});

test("pty: kill", { skip }, async () => {
  const t = await shared().pty.create({ cmd: ["sleep", "60"] });
  await t.kill();
  const r = await t.wait({ timeoutMs: 30_000 });
  assert.ok(r.signal === 9 || r.exitCode === 137, `signal ${r.signal}, exit ${r.exitCode}`);
});

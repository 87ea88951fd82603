// Running commands in a sandbox: sandbox.commands.
//
// A foreground run streams POST /v1/sandboxes/{id}/exec (NDJSON events,
// output base64 in JSON). A background run and connect use the WebSocket
// routes (exec/ws, processes/{pid}/attach): binary messages [stream byte] +
// bytes (0 stdin, 1 stdout, 2 stderr) and text JSON messages (Control from
// the client; started/exit/error Events from the server).

import { b64decode, b64encode, toBytes } from "./bytes.js";
import { CommandExitError, errorFromEvent, SpaceError, StreamCutError, TimeoutError } from "./errors.js";
import { concat, ndjson, sandboxPath, type Http, type Req } from "./http.js";
import type { Event, Exec, Exit, Process, WinSize } from "./types.js";
import { STDERR, STDIN, STDOUT, wsConnect, type WebSocketImpl, type WSConn } from "./ws.js";

/** Cmd is a shell line (run by /bin/sh -c) or an argv. */
export type Cmd = string | string[];

/** OutputCallback gets each piece of output as it arrives (text decoded as UTF-8). */
export type OutputCallback = (data: string) => void | Promise<void>;

const STDIN_CHUNK = 1 << 20;

/** CommandResult is how a command ended and what it wrote (bytes kept exactly). */
export class CommandResult {
  readonly stdoutBytes: Uint8Array;
  readonly stderrBytes: Uint8Array;
  readonly exitCode: number;
  /** The signal that killed the command, if one did. */
  readonly signal: number | undefined;
  /** The command hit its timeout and was killed. */
  readonly timedOut: boolean;
  /** The Process id (API) for the processes routes. */
  readonly pid: number | undefined;

  constructor(stdout: Uint8Array, stderr: Uint8Array, exit: Exit, pid: number | undefined) {
    this.stdoutBytes = stdout;
    this.stderrBytes = stderr;
    this.exitCode = exit.code;
    this.signal = exit.signal || undefined;
    this.timedOut = !!exit.timed_out;
    this.pid = pid;
  }

  /** stdout decoded as UTF-8 (invalid bytes replaced). */
  get stdout(): string {
    return new TextDecoder().decode(this.stdoutBytes);
  }

  get stderr(): string {
    return new TextDecoder().decode(this.stderrBytes);
  }

  /** ok: exit code 0 and no timeout. */
  get ok(): boolean {
    return this.exitCode === 0 && !this.timedOut;
  }
}

/** Output collects a command's output and events and calls the callbacks (sans-IO). */
export class Output {
  process: Process | undefined;
  exit: Exit | undefined;
  readonly #bufs: [Uint8Array[], Uint8Array[]] = [[], []];
  readonly #cbs: [((d: any) => unknown) | undefined, ((d: any) => unknown) | undefined];
  readonly #decoders: [TextDecoder, TextDecoder] | undefined;

  /** With text false the callbacks get bytes (a terminal's output). */
  constructor(onStdout?: (d: any) => unknown, onStderr?: (d: any) => unknown, text = true) {
    this.#cbs = [onStdout, onStderr];
    this.#decoders = text ? [new TextDecoder(), new TextDecoder()] : undefined;
  }

  /** write takes output of a stream; it returns what the callback returned (maybe a promise). */
  write(stream: number, data: Uint8Array): unknown {
    if ((stream !== STDOUT && stream !== STDERR) || data.length === 0) return undefined;
    const i = stream - 1;
    this.#bufs[i]!.push(data);
    const cb = this.#cbs[i];
    if (!cb) return undefined;
    if (!this.#decoders) return cb(data);
    const s = this.#decoders[i]!.decode(data, { stream: true });
    return s ? cb(s) : undefined;
  }

  bytes(stream: number): Uint8Array {
    return concat(this.#bufs[stream - 1]!);
  }

  #flush(): unknown[] {
    const res: unknown[] = [];
    if (!this.#decoders) return res;
    for (const i of [0, 1]) {
      const s = this.#decoders[i]!.decode();
      const cb = this.#cbs[i];
      if (s && cb) res.push(cb(s));
    }
    return res;
  }

  /** event takes an Event; it returns [done, callback results]. An error event throws. */
  event(ev: Event): [boolean, unknown[]] {
    switch (ev.type) {
      case "stdout":
      case "stderr":
        return [false, [this.write(ev.type === "stdout" ? STDOUT : STDERR, b64decode(ev.data ?? ""))]];
      case "started":
        if (ev.process) this.process = ev.process;
        return [false, []];
      case "exit":
        this.exit = ev.exit ?? { code: -1 };
        return [true, this.#flush()];
      case "error":
        throw errorFromEvent(ev.error);
      default:
        return [false, []]; // kinds this SDK does not know
    }
  }

  result(): CommandResult {
    return new CommandResult(this.bytes(STDOUT), this.bytes(STDERR), this.exit ?? { code: -1 }, this.process?.id);
  }
}

async function settle(values: unknown[]): Promise<void> {
  for (const v of values) if (v && typeof (v as Promise<unknown>).then === "function") await v;
}

/** Options of commands.run (and pty.create where they apply). */
export interface RunOptions {
  /** Environment variables added to the sandbox's. */
  env?: Record<string, string>;
  cwd?: string;
  /** A user name or uid[:gid]. */
  user?: string;
  /** Kill the command after this long (rounded up to whole seconds). */
  timeoutMs?: number;
  /** What the command reads on stdin (it sees EOF after it). */
  stdin?: string | Uint8Array;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** Throw CommandExitError when the command does not exit 0. */
  check?: boolean;
  /** Kill the command when the client goes away (default: it runs on). */
  killOnDisconnect?: boolean;
  /** A name kept with the command's Process (commands.list shows it): up to 256 bytes, no control characters. */
  tag?: string;
  /** Aborts a foreground run's stream (the command runs on unless killOnDisconnect). */
  signal?: AbortSignal;
}

/** buildExec returns the Exec of a command. */
export function buildExec(cmd: Cmd, o: RunOptions & { tty?: WinSize }, withStdin: boolean): Exec {
  const ex: Exec = {};
  if (typeof cmd === "string") ex.shell = cmd;
  else if (Array.isArray(cmd)) {
    if (cmd.length === 0) throw new TypeError("cmd: an empty argv");
    ex.command = cmd.map(String);
  } else throw new TypeError("cmd: a string (shell line) or an array of strings (argv)");
  if (o.env && Object.keys(o.env).length) ex.env = { ...o.env };
  if (o.cwd) ex.cwd = o.cwd;
  if (o.user) ex.user = o.user;
  if (o.timeoutMs) ex.timeout_seconds = Math.ceil(o.timeoutMs / 1000);
  if (withStdin && o.stdin !== undefined && o.stdin.length) {
    ex.stdin = b64encode(toBytes(o.stdin));
  }
  if (o.killOnDisconnect) ex.kill_on_disconnect = true;
  if (o.tag) ex.tag = o.tag;
  if (o.tty) ex.tty = o.tty;
  return ex;
}

/** The shared state of a sandbox's helpers: its id, the Space's Http and WebSocket choice. */
export interface SandboxRef {
  readonly id: string;
  readonly http: Http;
  readonly webSocket: WebSocketImpl;
  readonly sessions: Set<CommandHandle>;
}

function processPath(id: string, pid: number, rest = ""): string {
  return sandboxPath(id, `/processes/${Math.trunc(pid)}${rest}`);
}

function signalReq(id: string, pid: number, sig: number): Req {
  return { method: "POST", path: processPath(id, pid, "/signal"), json: { signal: Math.trunc(sig) }, sandbox: id, expect: [200, 204] };
}

/**
 * CommandHandle is a command attached over a WebSocket: stream stdin to it,
 * signal it, wait for it, or leave it running. `pid` is the Process id the
 * processes routes and commands.connect take.
 */
export class CommandHandle {
  readonly sandboxId: string;
  readonly process: Process;
  protected readonly out: Output;
  readonly #ref: SandboxRef;
  readonly #conn: WSConn;
  readonly #result: Promise<CommandResult>;
  #detached = false;
  #done = false;

  /** @internal Use commands.run(cmd, { background: true }), commands.connect or pty.create. */
  constructor(ref: SandboxRef, conn: WSConn, out: Output) {
    this.#ref = ref;
    this.sandboxId = ref.id;
    this.#conn = conn;
    this.out = out;
    this.process = out.process!;
    this.#result = this.#read().finally(() => {
      this.#done = true;
      ref.sessions.delete(this);
    });
    this.#result.catch(() => {}); // wait() reports it
    ref.sessions.add(this);
  }

  /** @internal */
  static async open<H extends CommandHandle>(
    this: new (ref: SandboxRef, conn: WSConn, out: Output) => H,
    ref: SandboxRef,
    path: string,
    first: Exec | undefined,
    out: Output,
  ): Promise<H> {
    const conn = await wsConnect(ref.http, ref.webSocket, ref.id, path);
    try {
      if (first) await conn.sendJSON(first);
      const msg = await conn.recv(); // the started (or error) event comes first
      if (msg === undefined) throw new StreamCutError(`connection closed before the started event: ${conn.closeReason}`);
      if (typeof msg !== "string") throw new SpaceError("internal", "the server sent output before the started event");
      out.event(JSON.parse(msg) as Event);
      if (!out.process) throw new SpaceError("internal", "the server's first message was not a started event");
    } catch (err) {
      conn.close();
      throw err;
    }
    return new this(ref, conn, out);
  }

  /** pid is the Process id (API), for commands.connect and the signal routes. */
  get pid(): number {
    return this.process.id;
  }

  /** guestPid is the process ID inside the guest. */
  get guestPid(): number {
    return this.process.pid;
  }

  /** done: the command exited (or the handle stopped following it). */
  get done(): boolean {
    return this.#done;
  }

  async #read(): Promise<CommandResult> {
    try {
      for (;;) {
        const msg = await this.#conn.recv();
        if (msg === undefined) {
          if (this.#detached) return this.out.result();
          throw new StreamCutError(`connection closed before the command exited: ${this.#conn.closeReason}`);
        }
        if (typeof msg !== "string") {
          if (msg.length) await settle([this.out.write(msg[0]!, msg.subarray(1))]);
          continue;
        }
        let done: boolean;
        let pending: unknown[];
        try {
          [done, pending] = this.out.event(JSON.parse(msg) as Event);
        } catch (err) {
          if (this.#detached) return this.out.result();
          throw err;
        }
        await settle(pending);
        if (done) return this.out.result();
      }
    } finally {
      this.#conn.close();
    }
  }

  /**
   * wait waits for the command to exit and returns its result. With
   * timeoutMs a TimeoutError leaves the command (and the handle) alone.
   */
  async wait(opts: { timeoutMs?: number } = {}): Promise<CommandResult> {
    if (opts.timeoutMs === undefined) return this.#result;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const t = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new TimeoutError(`command ${this.pid} still running after ${opts.timeoutMs} ms`)), opts.timeoutMs);
    });
    try {
      return await Promise.race([this.#result, t]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** sendStdin writes data to the command's stdin. */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const b = toBytes(data);
    for (let i = 0; i < b.length; i += STDIN_CHUNK) {
      const part = b.subarray(i, i + STDIN_CHUNK);
      const msg = new Uint8Array(part.length + 1);
      msg[0] = STDIN;
      msg.set(part, 1);
      await this.#conn.send(msg);
    }
  }

  /** closeStdin sends EOF to the command's stdin. */
  async closeStdin(): Promise<void> {
    await this.#conn.sendJSON({ type: "stdin_eof" });
  }

  /** resize changes the terminal size of a command started with a tty. */
  async resize(cols: number, rows: number): Promise<void> {
    await this.#conn.sendJSON({ type: "resize", rows: Math.trunc(rows), cols: Math.trunc(cols) });
  }

  /** signal sends signal number sig (e.g. 15) to the command. */
  async signal(sig: number): Promise<void> {
    await this.#ref.http.send(signalReq(this.sandboxId, this.pid, sig));
  }

  async kill(): Promise<void> {
    await this.signal(9);
  }

  /**
   * disconnect leaves the command running and stops following it (re-attach
   * later with commands.connect(pid)); wait() then returns what arrived.
   */
  async disconnect(): Promise<void> {
    if (this.#done) return;
    this.#detached = true;
    try {
      await this.#conn.sendJSON({ type: "detach" });
    } catch {
      // closed already
    }
    this.#conn.close();
    await this.#result.catch(() => {});
  }

  /**
   * drop closes the connection as a client that goes away would (no detach
   * message): the command keeps running unless killOnDisconnect was set.
   */
  async drop(): Promise<void> {
    if (this.#done) return;
    this.#detached = true;
    this.#conn.close();
    await this.#result.catch(() => {});
  }
}

/** Interpreters of runCode, fed the snippet on stdin. */
const INTERPRETERS: Record<string, string[]> = {
  python: ["python3", "-"],
  javascript: ["node", "-"],
  shell: ["/bin/sh", "-s"],
  bash: ["/bin/bash", "-s"],
};

/** Commands is sandbox.commands. */
export class Commands {
  readonly #ref: SandboxRef;

  /** @internal */
  constructor(ref: SandboxRef) {
    this.#ref = ref;
  }

  /**
   * run runs cmd (a shell line or an argv) and returns its CommandResult;
   * with background: true it returns a CommandHandle once the command started.
   */
  run(cmd: Cmd, opts: RunOptions & { background: true }): Promise<CommandHandle>;
  run(cmd: Cmd, opts?: RunOptions & { background?: false }): Promise<CommandResult>;
  async run(cmd: Cmd, opts: RunOptions & { background?: boolean } = {}): Promise<CommandResult | CommandHandle> {
    const ref = this.#ref;
    const out = new Output(opts.onStdout, opts.onStderr);
    if (opts.background) {
      const h = await CommandHandle.open(ref, sandboxPath(ref.id, "/exec/ws"), buildExec(cmd, opts, false), out);
      if (opts.stdin !== undefined) {
        await h.sendStdin(opts.stdin);
        await h.closeStdin();
      }
      return h;
    }
    const req: Req = {
      method: "POST",
      path: sandboxPath(ref.id, "/exec"),
      json: buildExec(cmd, opts, true),
      sandbox: ref.id,
      accept: "application/x-ndjson",
    };
    if (opts.signal) req.signal = opts.signal;
    const r = await followNDJSON(ref.http, req, out);
    if (opts.check && !r.ok) throw new CommandExitError(r);
    return r;
  }

  /** runCode runs a snippet (python, javascript, shell or bash), fed to its interpreter on stdin. */
  async runCode(code: string, opts: Omit<RunOptions, "stdin"> & { language?: string } = {}): Promise<CommandResult> {
    const lang = opts.language ?? "python";
    const argv = INTERPRETERS[lang];
    if (!argv) throw new TypeError(`language ${JSON.stringify(lang)}: want one of ${Object.keys(INTERPRETERS).join(", ")}`);
    return this.run(argv, { ...opts, stdin: code });
  }

  /**
   * connect attaches to a running command by its Process id: its buffered
   * output (up to 1 MiB) that no client received is replayed, then live output follows.
   * An earlier handle of the command is taken over (it ends), unless share is set:
   * then both follow it, this one from now on.
   */
  async connect(
    pid: number,
    opts: { onStdout?: OutputCallback; onStderr?: OutputCallback; share?: boolean } = {},
  ): Promise<CommandHandle> {
    const out = new Output(opts.onStdout, opts.onStderr);
    const path = processPath(this.#ref.id, pid, "/attach") + (opts.share ? "?share=true" : "");
    return CommandHandle.open(this.#ref, path, undefined, out);
  }

  /** list returns the sandbox's processes (running and exited). */
  async list(): Promise<Process[]> {
    const id = this.#ref.id;
    const doc = await this.#ref.http.json<{ processes: Process[] }>({ method: "GET", path: sandboxPath(id, "/processes"), sandbox: id, idempotent: true });
    return doc.processes ?? [];
  }

  async get(pid: number): Promise<Process> {
    const id = this.#ref.id;
    return this.#ref.http.json<Process>({ method: "GET", path: processPath(id, pid), sandbox: id, idempotent: true });
  }

  /** output follows a command's output read-only until it exits (NDJSON route). */
  async output(pid: number, opts: { onStdout?: OutputCallback; onStderr?: OutputCallback } = {}): Promise<CommandResult> {
    const id = this.#ref.id;
    const req: Req = { method: "GET", path: processPath(id, pid, "/output"), sandbox: id, accept: "application/x-ndjson", idempotent: true };
    return followNDJSON(this.#ref.http, req, new Output(opts.onStdout, opts.onStderr));
  }

  async signal(pid: number, sig: number): Promise<void> {
    await this.#ref.http.send(signalReq(this.#ref.id, pid, sig));
  }

  async kill(pid: number): Promise<void> {
    await this.signal(pid, 9);
  }

  /**
   * sendStdin writes data (at most 1 MiB) to a running command's stdin
   * without attaching; with eof its stdin is closed after. The command must
   * have been started with stdin open (a background run or an attach).
   */
  async sendStdin(pid: number, data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<void> {
    const id = this.#ref.id;
    await this.#ref.http.send({
      method: "POST",
      path: processPath(id, pid, "/stdin"),
      query: opts.eof ? [["eof", "true"]] : [],
      body: toBytes(data),
      sandbox: id,
      expect: [200, 204],
    });
  }

  /** resize sets the terminal size of a running command started on a terminal. */
  async resize(pid: number, cols: number, rows: number): Promise<void> {
    const id = this.#ref.id;
    await this.#ref.http.send({
      method: "POST",
      path: processPath(id, pid, "/resize"),
      json: { rows: Math.trunc(rows), cols: Math.trunc(cols) },
      sandbox: id,
      expect: [200, 204],
    });
  }
}

/** followNDJSON reads an exec or output stream into out until its exit event. */
export async function followNDJSON(http: Http, req: Req, out: Output): Promise<CommandResult> {
  const resp = await http.stream(req);
  if (!resp.body) throw new StreamCutError("empty output stream");
  for await (const ev of ndjson(resp.body, "output")) {
    const [done, pending] = out.event(ev as Event);
    await settle(pending);
    if (done) return out.result();
  }
  throw new StreamCutError();
}

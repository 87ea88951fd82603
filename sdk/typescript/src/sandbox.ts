// Sandboxes: space.sandboxes and the Sandbox objects it returns.

import { Commands, type CommandHandle, type SandboxRef } from "./commands.js";
import { NotFoundError } from "./errors.js";
import { Files } from "./files.js";
import { ndjson, sandboxPath, type Http, type Req } from "./http.js";
import { Ports } from "./ports.js";
import { Pty } from "./pty.js";
import type {
  Checkpoint,
  CheckpointList,
  CheckpointPolicy,
  CreateSandbox,
  EgressEvent,
  Network,
  SandboxInfo,
  SandboxMetrics,
  SandboxState,
  Snapshot,
} from "./types.js";
import type { WebSocketImpl } from "./ws.js";
import type { Space } from "./client.js";

/** NetworkArg is an egress policy: a Network, or just its allow rules. */
export type NetworkArg = Network | string[];

/** CreateOptions are the fields of a new sandbox (all optional). */
export interface CreateOptions {
  /** The template, e.g. "default" or "py-data:3" (default: the server's default template). */
  template?: string;
  vcpus?: number;
  memoryMib?: number;
  diskMib?: number;
  /** How long the sandbox lives (rounded up to whole seconds; the server's default when unset). */
  timeoutMs?: number;
  /** What expiry does: "delete" (default) or "suspend". */
  onTimeout?: "delete" | "suspend";
  env?: Record<string, string>;
  labels?: Record<string, string>;
  /** The egress policy: allow rules ("pypi.org:443") or a Network. */
  network?: NetworkArg;
  /** Names of team secrets to grant. */
  secrets?: string[];
  /** Start from this snapshot (ID or name) instead of a template. */
  fromSnapshot?: string;
  /** Start from this checkpoint instead of a template. */
  fromCheckpoint?: string;
  checkpoints?: CheckpointPolicy;
  /** Boot the VM instead of restoring the template's snapshot. */
  coldBoot?: boolean;
}

function network(n: NetworkArg): Network {
  if (typeof n === "string") throw new TypeError("network: an array of allow rules or a Network, not a string");
  return Array.isArray(n) ? { allow: [...n] } : n;
}

/** createBody returns the CreateSandbox document of the options. */
export function createBody(o: CreateOptions): CreateSandbox {
  const b: Partial<CreateSandbox> = {};
  if (o.template !== undefined) b.template = o.template;
  if (o.vcpus !== undefined) b.vcpus = o.vcpus;
  if (o.memoryMib !== undefined) b.memory_mib = o.memoryMib;
  if (o.diskMib !== undefined) b.disk_mib = o.diskMib;
  if (o.timeoutMs !== undefined) b.timeout_seconds = Math.ceil(o.timeoutMs / 1000);
  if (o.onTimeout !== undefined) b.on_timeout = o.onTimeout;
  if (o.env !== undefined) b.env = { ...o.env };
  if (o.labels !== undefined) b.labels = { ...o.labels };
  if (o.network !== undefined) b.network = network(o.network);
  if (o.secrets !== undefined) b.secrets = [...o.secrets];
  if (o.fromSnapshot !== undefined) b.from_snapshot = o.fromSnapshot;
  if (o.fromCheckpoint !== undefined) b.from_checkpoint = o.fromCheckpoint;
  if (o.checkpoints !== undefined) b.checkpoints = o.checkpoints;
  if (o.coldBoot !== undefined) b.cold_boot = o.coldBoot;
  return b as CreateSandbox;
}

/**
 * Sandbox is one sandbox. `await using sb = await space.sandboxes.create()`
 * deletes it at the end of the block.
 */
export class Sandbox implements SandboxRef {
  readonly id: string;
  /** info is the sandbox as last fetched (undefined for sandboxes.connect until refresh). */
  info: SandboxInfo | undefined;
  readonly commands: Commands;
  readonly files: Files;
  readonly pty: Pty;
  readonly ports: Ports;
  /** The Space this sandbox talks through. */
  readonly space: Space;
  /** @internal */
  readonly http: Http;
  /** @internal */
  readonly webSocket: WebSocketImpl;
  /** @internal */
  readonly sessions: Set<CommandHandle>;
  #ownsSpace = false;

  /** @internal Use space.sandboxes.create, get or connect. */
  constructor(space: Space, id: string, info?: SandboxInfo) {
    this.space = space;
    this.id = id;
    this.info = info;
    const s = space as unknown as { http: Http; webSocket: WebSocketImpl; sessions: Set<CommandHandle> };
    this.http = s.http;
    this.webSocket = s.webSocket;
    this.sessions = s.sessions;
    this.commands = new Commands(this);
    this.files = new Files(this);
    this.pty = new Pty(this);
    this.ports = new Ports(this);
  }

  /** state is the state when last fetched ("" before any fetch). */
  get state(): SandboxState | "" {
    return this.info?.state ?? "";
  }

  get labels(): Record<string, string> {
    return { ...(this.info?.labels ?? {}) };
  }

  async #call(req: Req): Promise<this> {
    this.info = await this.http.json<SandboxInfo>(req);
    return this;
  }

  #op(action: string, body?: unknown, idempotent = false, expect = [200]): Req {
    const r: Req = { method: "POST", path: sandboxPath(this.id, "/" + action), idempotent, expect };
    if (body !== undefined) r.json = body;
    return r;
  }

  #put(what: string, body: unknown): Req {
    return { method: "PUT", path: sandboxPath(this.id, "/" + what), json: body, idempotent: true };
  }

  /** refresh fetches the sandbox again. */
  refresh(): Promise<this> {
    return this.#call({ method: "GET", path: sandboxPath(this.id), idempotent: true });
  }

  /** delete stops the VM and deletes the sandbox; with missingOk a sandbox already gone is fine. */
  async delete(opts: { missingOk?: boolean } = {}): Promise<void> {
    try {
      await this.http.send({ method: "DELETE", path: sandboxPath(this.id), expect: [200, 204], idempotent: true });
    } catch (err) {
      if (!(opts.missingOk && err instanceof NotFoundError)) throw err;
    }
  }

  /** kill is delete. */
  kill(opts: { missingOk?: boolean } = {}): Promise<void> {
    return this.delete(opts);
  }

  /** pause stops the vCPUs and keeps the memory (a no-op when paused). */
  pause(): Promise<this> {
    return this.#call(this.#op("pause", undefined, true));
  }

  /** suspend writes the sandbox to the chunk store and frees its VM. */
  suspend(): Promise<this> {
    return this.#call(this.#op("suspend"));
  }

  /** resume runs a paused or suspended sandbox again. */
  resume(): Promise<this> {
    return this.#call(this.#op("resume", undefined, true));
  }

  /** setTimeout makes the sandbox expire ms from now (rounded up to whole seconds). */
  setTimeout(ms: number): Promise<this> {
    return this.#call(this.#op("timeout", { timeout_seconds: Math.ceil(ms / 1000) }, true));
  }

  /** setNetwork replaces the egress policy (a Network, or its allow rules). */
  setNetwork(n: NetworkArg): Promise<this> {
    return this.#call(this.#put("network", network(n)));
  }

  /** setSecrets grants exactly these team secrets from now on ([] for none). */
  setSecrets(names: string[]): Promise<this> {
    return this.#call(this.#put("secrets", { secrets: [...names] }));
  }

  /** snapshot takes a live snapshot (the sandbox runs on). */
  async snapshot(name?: string): Promise<Snapshot> {
    return this.http.json<Snapshot>(this.#op("snapshots", name ? { name } : {}, false, [201]));
  }

  /** restore rolls the sandbox back in place to a snapshot (ID or name) or a checkpoint. */
  restore(ref: string | { snapshot?: string; checkpoint?: string }): Promise<this> {
    const body = typeof ref === "string" ? { snapshot: ref } : ref;
    if (!body.snapshot === !body.checkpoint) throw new TypeError("restore: give a snapshot or a checkpoint (one of them)");
    return this.#call(this.#op("restore", body));
  }

  /** fork makes count running copies of this sandbox, as new sandboxes. */
  async fork(count = 1): Promise<Sandbox[]> {
    const doc = await this.http.json<{ sandboxes: SandboxInfo[] }>(this.#op("fork", { count: Math.trunc(count) }, false, [201]));
    return doc.sandboxes.map((s) => new Sandbox(this.space, s.id, s));
  }

  /** checkpoints lists the sandbox's checkpoints and its policy. */
  checkpoints(): Promise<CheckpointList> {
    return this.http.json<CheckpointList>({ method: "GET", path: sandboxPath(this.id, "/checkpoints"), idempotent: true });
  }

  /**
   * metrics returns the sandbox's usage history (CPU, memory, disk, network)
   * between start and end, oldest first; either may be left out. The worker
   * samples a running sandbox every few seconds.
   */
  metrics(opts: { start?: Date | number; end?: Date | number } = {}): Promise<SandboxMetrics> {
    const query: [string, string][] = [];
    for (const [k, v] of [["start", opts.start], ["end", opts.end]] as const) {
      if (v === undefined) continue;
      query.push([k, v instanceof Date ? v.toISOString() : String(Math.trunc(v))]);
    }
    return this.http.json<SandboxMetrics>({ method: "GET", path: sandboxPath(this.id, "/metrics"), query, idempotent: true });
  }

  /** checkpoint takes a checkpoint now. */
  checkpoint(): Promise<Checkpoint> {
    return this.http.json<Checkpoint>(this.#op("checkpoints", undefined, false, [201]));
  }

  /** setCheckpointPolicy replaces the checkpoint policy. */
  setCheckpointPolicy(p: CheckpointPolicy): Promise<this> {
    return this.#call(this.#put("checkpoints/policy", p));
  }

  /** portOpen tells whether something in the sandbox accepts TCP connections on port (ports.isOpen). */
  portOpen(port: number): Promise<boolean> {
    return this.ports.isOpen(port);
  }

  /** egressLog returns the decisions of the sandbox's egress gateway so far, oldest first. */
  async egressLog(): Promise<EgressEvent[]> {
    const resp = await this.http.stream({ method: "GET", path: sandboxPath(this.id, "/egress"), accept: "application/x-ndjson", idempotent: true });
    const events: EgressEvent[] = [];
    if (resp.body) for await (const ev of ndjson(resp.body, "egress log")) events.push(ev as EgressEvent);
    return events;
  }

  /**
   * create creates a sandbox with a Space of its own (apiUrl and apiKey
   * default to $SPACE_API_URL and $SPACE_API_KEY), which the sandbox's
   * dispose closes.
   */
  static async create(opts: CreateOptions & { apiUrl?: string; apiKey?: string } = {}): Promise<Sandbox> {
    const { Space } = await import("./client.js");
    const { apiUrl, apiKey, ...rest } = opts;
    const space = new Space({ apiUrl, apiKey });
    try {
      const sb = await space.sandboxes.create(rest);
      sb.#ownsSpace = true;
      return sb;
    } catch (err) {
      await space.close();
      throw err;
    }
  }

  /** close closes the Space Sandbox.create made (the sandbox keeps running); a no-op otherwise. */
  async close(): Promise<void> {
    if (this.#ownsSpace) await this.space.close();
  }

  /** Symbol.asyncDispose deletes the sandbox (gone already is fine) and closes its own Space. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.delete({ missingOk: true });
    } finally {
      await this.close();
    }
  }

  toString(): string {
    return `Sandbox(${this.id} ${this.state || "?"})`;
  }
}

/** Sandboxes is space.sandboxes. */
export class Sandboxes {
  readonly #space: Space;
  readonly #http: Http;

  /** @internal */
  constructor(space: Space, http: Http) {
    this.#space = space;
    this.#http = http;
  }

  /** create creates a sandbox and waits until it runs. */
  async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const info = await this.#http.json<SandboxInfo>({ method: "POST", path: "/v1/sandboxes", json: createBody(opts), expect: [201, 200] });
    return new Sandbox(this.#space, info.id, info);
  }

  /** get fetches a sandbox. */
  async get(id: string): Promise<Sandbox> {
    const info = await this.#http.json<SandboxInfo>({ method: "GET", path: sandboxPath(id), idempotent: true });
    return new Sandbox(this.#space, info.id, info);
  }

  /** connect returns a Sandbox for id without a request (info undefined until refresh). */
  connect(id: string): Sandbox {
    return new Sandbox(this.#space, id);
  }

  /** list lists the team's sandboxes, filtered by state(s) and labels (all must match). */
  async list(filter: { state?: SandboxState | SandboxState[]; labels?: Record<string, string> } = {}): Promise<Sandbox[]> {
    const query: [string, string][] = [];
    const states = filter.state === undefined ? [] : Array.isArray(filter.state) ? filter.state : [filter.state];
    for (const s of states) query.push(["state", s]);
    for (const k of Object.keys(filter.labels ?? {}).sort()) query.push(["label", `${k}=${filter.labels![k]}`]);
    const doc = await this.#http.json<{ sandboxes: SandboxInfo[] }>({ method: "GET", path: "/v1/sandboxes", query, idempotent: true });
    return (doc.sandboxes ?? []).map((s) => new Sandbox(this.#space, s.id, s));
  }
}

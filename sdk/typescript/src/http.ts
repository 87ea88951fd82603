// HTTP plumbing: one Http per Space. It routes a sandbox's data-plane
// requests (exec, processes, files, ports) to the data plane its Sandbox
// reply names, with that plane's token, fetching a new token once when the
// data plane answers 401 (as client/client.go does), and retries 429 and
// 503 with backoff for idempotent requests only.

import { errorFromResponse, SpaceError, StreamCutError } from "./errors.js";

export const VERSION = "0.1.0";
const USER_AGENT = `space-sdk-typescript/${VERSION}`;
export const DEFAULT_URL = "http://127.0.0.1:7070";

// A data-plane token is replaced this long before it expires; a sandbox
// that names no data plane is asked again after NO_PLANE_FOR.
const PLANE_MARGIN_MS = 30_000;
const NO_PLANE_FOR_MS = 30_000;
const MAX_ERROR_BODY = 64 << 10;
const RETRY_STATUSES = new Set([429, 503]);
const CONNECT_ERRORS = new Set(["ECONNREFUSED", "ECONNRESET", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT", "ETIMEDOUT"]);

/**
 * BodyData is what a request body may be: bytes and strings are sent as
 * they are (and may be retried); a Blob, a ReadableStream or any async
 * iterable of bytes (a Node stream.Readable, say) is streamed.
 */
export type BodyData =
  | string
  | Uint8Array
  | ArrayBuffer
  | Blob
  | ReadableStream<Uint8Array>
  | AsyncIterable<Uint8Array | string>;

/** Req describes one API call. */
export interface Req {
  method: string;
  path: string;
  query?: [string, string][];
  json?: unknown;
  body?: BodyData;
  contentType?: string;
  headers?: Record<string, string>;
  /** Statuses that are success (default [200]). */
  expect?: number[];
  /** A data-plane request of this sandbox. */
  sandbox?: string;
  /** 429/503 may be retried. */
  idempotent?: boolean;
  accept?: string;
  signal?: AbortSignal;
}

/** Reply is a buffered answer. */
export interface Reply {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

export interface Config {
  apiUrl: string;
  apiKey: string;
  timeoutMs: number;
  maxRetries: number;
  fetch: typeof fetch;
}

export function makeConfig(o: {
  apiUrl?: string | undefined;
  apiKey?: string | undefined;
  timeoutMs?: number | undefined;
  maxRetries?: number | undefined;
  fetch?: typeof fetch | undefined;
}): Config {
  const env = typeof process !== "undefined" && process.env ? process.env : {};
  const raw = (o.apiUrl ?? env.SPACE_API_URL ?? DEFAULT_URL).replace(/\/+$/, "");
  let u: URL;
  try {
    u = new URL(raw);
  } catch {
    throw new TypeError(`apiUrl ${JSON.stringify(raw)}: want http(s)://host[:port][/prefix]`);
  }
  if (u.protocol !== "http:" && u.protocol !== "https:") {
    throw new TypeError(`apiUrl ${JSON.stringify(raw)}: want http(s)://host[:port][/prefix]`);
  }
  const f = o.fetch ?? globalThis.fetch;
  if (typeof f !== "function") throw new TypeError("no fetch: pass one as the fetch option");
  return {
    apiUrl: u.origin + u.pathname.replace(/\/+$/, ""),
    apiKey: o.apiKey ?? env.SPACE_API_KEY ?? "",
    timeoutMs: o.timeoutMs ?? 300_000,
    maxRetries: o.maxRetries ?? 4,
    fetch: f.bind(globalThis),
  };
}

export function sandboxPath(id: string, rest = ""): string {
  return "/v1/sandboxes/" + encodeURIComponent(id) + rest;
}

export function esc(segment: string): string {
  return encodeURIComponent(segment);
}

/** retryDelayMs is how long to wait before retry number attempt (0-based). */
export function retryDelayMs(attempt: number, headers?: Headers): number {
  const ra = headers?.get("Retry-After");
  if (ra) {
    const s = Number(ra);
    if (Number.isFinite(s)) return Math.min(Math.max(s, 0), 30) * 1000;
  }
  return Math.min(250 * 2 ** attempt, 8000) * (0.5 + Math.random() / 2);
}

function isReplayable(b: BodyData | undefined): boolean {
  return b === undefined || typeof b === "string" || b instanceof Uint8Array || b instanceof ArrayBuffer;
}

/** toStream makes a ReadableStream of an async iterable of bytes. */
export function toStream(it: AsyncIterable<Uint8Array | string>): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  let iter: AsyncIterator<Uint8Array | string> | undefined;
  return new ReadableStream<Uint8Array>({
    async pull(ctrl) {
      iter ??= it[Symbol.asyncIterator]();
      const { value, done } = await iter.next();
      if (done) ctrl.close();
      else ctrl.enqueue(typeof value === "string" ? enc.encode(value) : value);
    },
    async cancel(reason) {
      await iter?.return?.(reason);
    },
  });
}

function fetchBody(b: BodyData | undefined): { body?: BodyInit; duplex?: boolean } {
  if (b === undefined) return {};
  if (typeof b === "string" || b instanceof Uint8Array || b instanceof ArrayBuffer || b instanceof Blob) {
    return { body: b as BodyInit };
  }
  if (b instanceof ReadableStream) return { body: b, duplex: true };
  if (Symbol.asyncIterator in b) return { body: toStream(b), duplex: true };
  throw new TypeError("body: a string, bytes, a Blob, a ReadableStream or an async iterable of bytes");
}

/** parseTime parses an RFC 3339 time (nanoseconds allowed) as milliseconds since the epoch. */
export function parseTime(s: string): number {
  const t = Date.parse(s.replace(/(\.\d{3})\d+/, "$1"));
  if (Number.isNaN(t)) throw new RangeError(`time ${JSON.stringify(s)}`);
  return t;
}

interface Plane {
  base: string | undefined; // undefined: through the API server with the API key
  token: string;
  expires: number;
}

/** Router knows where each sandbox's data-plane requests go. */
export class Router {
  readonly #cfg: Config;
  readonly #planes = new Map<string, Plane>();

  constructor(cfg: Config) {
    this.#cfg = cfg;
  }

  /** lookup returns [base URL, credential], or undefined when the sandbox must be fetched first. */
  lookup(sandbox: string): [string, string] | undefined {
    const p = this.#planes.get(sandbox);
    if (!p || Date.now() + PLANE_MARGIN_MS >= p.expires) return undefined;
    return p.base ? [p.base, p.token] : [this.#cfg.apiUrl, this.#cfg.apiKey];
  }

  /** afterFetch is the route once the sandbox was fetched (or failed to be). */
  afterFetch(sandbox: string): [string, string] {
    if (!this.#planes.has(sandbox)) {
      this.#planes.set(sandbox, { base: undefined, token: "", expires: Date.now() + PLANE_MARGIN_MS + NO_PLANE_FOR_MS });
    }
    return this.lookup(sandbox) ?? [this.#cfg.apiUrl, this.#cfg.apiKey];
  }

  remember(sb: { id?: unknown; data_plane?: { url?: string; token?: string; expires_at?: string } }): void {
    const id = typeof sb.id === "string" ? sb.id : "";
    if (!id) return;
    const dp = sb.data_plane;
    if (!dp) {
      this.#planes.set(id, { base: undefined, token: "", expires: Date.now() + PLANE_MARGIN_MS + NO_PLANE_FOR_MS });
      return;
    }
    let u: URL;
    let expires: number;
    try {
      u = new URL(String(dp.url ?? ""));
      expires = parseTime(String(dp.expires_at ?? ""));
    } catch {
      this.forget(id);
      return;
    }
    if ((u.protocol !== "http:" && u.protocol !== "https:") || !dp.token) {
      this.forget(id);
      return;
    }
    this.#planes.set(id, { base: u.origin + u.pathname.replace(/\/+$/, ""), token: dp.token, expires });
  }

  rememberReply(doc: unknown): void {
    if (!doc || typeof doc !== "object") return;
    const d = doc as Record<string, unknown>;
    if (Array.isArray(d.sandboxes)) {
      for (const sb of d.sandboxes) if (sb && typeof sb === "object") this.remember(sb as never);
    } else if ("id" in d && "team" in d && "state" in d) {
      this.remember(d as never);
    }
  }

  forget(sandbox: string): void {
    this.#planes.delete(sandbox);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function connectFailure(err: unknown): boolean {
  const cause = (err as { cause?: { code?: string } })?.cause;
  return err instanceof TypeError && !!cause && CONNECT_ERRORS.has(String(cause.code));
}

/** Http sends Reqs for one Space. */
export class Http {
  readonly cfg: Config;
  readonly router: Router;

  constructor(cfg: Config) {
    this.cfg = cfg;
    this.router = new Router(cfg);
  }

  /** route returns [base URL, credential] for a request of sandbox (or of the API). */
  async route(sandbox: string | undefined): Promise<[string, string]> {
    if (!sandbox) return [this.cfg.apiUrl, this.cfg.apiKey];
    const r = this.router.lookup(sandbox);
    if (r) return r;
    try {
      await this.json({ method: "GET", path: sandboxPath(sandbox), idempotent: true });
    } catch {
      // the request itself gets the server's answer
    }
    return this.router.afterFetch(sandbox);
  }

  async #fetchOnce(req: Req, base: string, auth: string, signal: AbortSignal): Promise<Response> {
    const h = new Headers({ "User-Agent": USER_AGENT, Accept: req.accept ?? "application/json" });
    let body = req.body;
    if (req.json !== undefined) {
      body = JSON.stringify(req.json);
      h.set("Content-Type", "application/json");
    } else if (body !== undefined) {
      h.set("Content-Type", req.contentType ?? "application/octet-stream");
    }
    for (const [k, v] of Object.entries(req.headers ?? {})) h.set(k, v);
    if (auth) h.set("Authorization", "Bearer " + auth);
    else h.delete("Authorization");
    let url = base + req.path;
    if (req.query?.length) url += "?" + new URLSearchParams(req.query).toString();
    const fb = fetchBody(body);
    const init: RequestInit & { duplex?: "half" } = { method: req.method, headers: h, signal };
    if (fb.body !== undefined) init.body = fb.body;
    if (fb.duplex) init.duplex = "half";
    return this.cfg.fetch(url, init);
  }

  async #sendOnce(req: Req, signal: AbortSignal): Promise<Response> {
    let [base, auth] = await this.route(req.sandbox);
    let resp = await this.#fetchOnce(req, base, auth, signal);
    if (resp.status === 401 && req.sandbox && isReplayable(req.body) && auth !== this.cfg.apiKey) {
      await resp.body?.cancel().catch(() => {});
      this.router.forget(req.sandbox); // a data-plane token refused: once more with a new one
      [base, auth] = await this.route(req.sandbox);
      resp = await this.#fetchOnce(req, base, auth, signal);
    }
    return resp;
  }

  /**
   * stream sends req and returns the Response with its body unread; the
   * timeout covers only the wait for the status and headers. A status
   * outside req.expect throws its SpaceError.
   */
  async stream(req: Req): Promise<Response> {
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(req.signal?.reason);
    if (req.signal?.aborted) onAbort();
    req.signal?.addEventListener("abort", onAbort, { once: true });
    const timer = setTimeout(() => ctl.abort(new DOMException("request timed out", "TimeoutError")), this.cfg.timeoutMs);
    try {
      return await this.#retrying(req, ctl.signal);
    } finally {
      clearTimeout(timer);
    }
  }

  async #retrying(req: Req, signal: AbortSignal): Promise<Response> {
    const retryable = !!req.idempotent && isReplayable(req.body);
    const expect = req.expect ?? [200];
    for (let attempt = 0; ; attempt++) {
      let resp: Response;
      try {
        resp = await this.#sendOnce(req, signal);
      } catch (err) {
        if (!retryable || attempt >= this.cfg.maxRetries || !connectFailure(err)) throw err;
        await sleep(retryDelayMs(attempt));
        continue;
      }
      if (expect.includes(resp.status)) return resp;
      const body = await readLimited(resp, MAX_ERROR_BODY);
      if (RETRY_STATUSES.has(resp.status) && retryable && attempt < this.cfg.maxRetries) {
        await sleep(retryDelayMs(attempt, resp.headers));
        continue;
      }
      throw errorFromResponse(resp.status, body);
    }
  }

  /** send sends req and reads the whole answer (the timeout covers it all). */
  async send(req: Req): Promise<Reply> {
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(req.signal?.reason);
    if (req.signal?.aborted) onAbort();
    req.signal?.addEventListener("abort", onAbort, { once: true });
    const timer = setTimeout(() => ctl.abort(new DOMException("request timed out", "TimeoutError")), this.cfg.timeoutMs);
    try {
      const resp = await this.#retrying(req, ctl.signal);
      const body = new Uint8Array(await resp.arrayBuffer());
      return { status: resp.status, headers: resp.headers, body };
    } finally {
      clearTimeout(timer);
      req.signal?.removeEventListener("abort", onAbort);
    }
  }

  /** json sends req and parses the answer (undefined for an empty one). */
  async json<T = unknown>(req: Req): Promise<T> {
    const r = await this.send(req);
    if (r.body.length === 0) return undefined as T;
    const doc = JSON.parse(new TextDecoder().decode(r.body)) as unknown;
    this.router.rememberReply(doc);
    return doc as T;
  }
}

async function readLimited(resp: Response, max: number): Promise<Uint8Array> {
  if (!resp.body) return new Uint8Array();
  const reader = resp.body.getReader();
  const parts: Uint8Array[] = [];
  let n = 0;
  try {
    while (n < max) {
      const { value, done } = await reader.read();
      if (done) break;
      parts.push(value);
      n += value.length;
    }
  } catch {
    // a cut error body: keep what arrived
  } finally {
    reader.cancel().catch(() => {});
  }
  return concat(parts).subarray(0, max);
}

export function concat(parts: Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0]!;
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

/**
 * ndjson yields the non-empty lines of an NDJSON body, parsed. A body that
 * breaks mid-way throws StreamCutError.
 */
export async function* ndjson(body: ReadableStream<Uint8Array>, what: string): AsyncGenerator<unknown> {
  const dec = new TextDecoder();
  const reader = body.getReader();
  let buf = "";
  try {
    for (;;) {
      let r: ReadableStreamReadResult<Uint8Array>;
      try {
        r = await reader.read();
      } catch (err) {
        throw new StreamCutError(`${what} stream cut: ${(err as Error)?.message ?? err}`);
      }
      if (r.done) break;
      buf += dec.decode(r.value, { stream: true });
      let start = 0;
      let i: number;
      while ((i = buf.indexOf("\n", start)) >= 0) {
        const line = buf.slice(start, i);
        start = i + 1;
        if (line.trim()) yield JSON.parse(line);
      }
      buf = buf.slice(start);
    }
    buf += dec.decode();
    if (buf.trim()) yield JSON.parse(buf);
  } finally {
    reader.cancel().catch(() => {});
  }
}

export { SpaceError };

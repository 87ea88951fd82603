// Exposed ports: sandbox.ports reaches a TCP port of the sandbox.
//
// fetch sends an HTTP request to a server in the sandbox through
// /v1/sandboxes/{id}/ports/{port}/http/{path} (the sandbox's gateway) and
// returns the guest server's answer as it sent it, whatever its status.
// SPACE's own refusals (no such sandbox, no network, nothing listening on
// the port) throw their SpaceError: the server marks every answer of the
// guest with a Space-Port header.

import { errorFromResponse, TimeoutError } from "./errors.js";
import { sandboxPath, type BodyData, type Req } from "./http.js";
import type { SandboxRef } from "./commands.js";
import type { PortState } from "./types.js";

const GUEST_HEADER = "Space-Port";
const ANY_STATUS = Array.from({ length: 500 }, (_, i) => i + 100);

function checkPort(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError(`port ${port}: want 1-65535`);
  return port;
}

/** PortRequestInit is the fetch init a port request takes (method, headers, body, signal). */
export interface PortRequestInit {
  method?: string;
  headers?: HeadersInit;
  body?: BodyData | null;
  signal?: AbortSignal;
}

/** Ports is sandbox.ports. */
export class Ports {
  readonly #ref: SandboxRef;

  /** @internal */
  constructor(ref: SandboxRef) {
    this.#ref = ref;
  }

  /** isOpen tells whether something in the sandbox accepts TCP connections on port. */
  async isOpen(port: number): Promise<boolean> {
    const id = this.#ref.id;
    const doc = await this.#ref.http.json<PortState>({ method: "GET", path: sandboxPath(id, `/ports/${checkPort(port)}`), sandbox: id, idempotent: true });
    return !!doc.open;
  }

  /** waitOpen polls isOpen until port accepts connections; TimeoutError after timeoutMs (default 60 s). */
  async waitOpen(port: number, opts: { timeoutMs?: number; intervalMs?: number } = {}): Promise<void> {
    const timeoutMs = opts.timeoutMs ?? 60_000;
    const deadline = Date.now() + timeoutMs;
    while (!(await this.isOpen(port))) {
      if (Date.now() >= deadline) throw new TimeoutError(`port ${port} of ${this.#ref.id} did not open within ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, opts.intervalMs ?? 200));
    }
  }

  /**
   * fetch sends an HTTP request to http://SANDBOX:port/path and returns the
   * guest server's Response, any status; its body is a stream. The request
   * timeout covers only the wait for the answer's headers.
   */
  async fetch(port: number, path = "/", init: PortRequestInit = {}): Promise<Response> {
    const id = this.#ref.id;
    const method = (init.method ?? "GET").toUpperCase();
    const headers: Record<string, string> = {};
    new Headers(init.headers ?? {}).forEach((v, k) => (headers[k] = v));
    const [p, query] = splitQuery(path);
    const req: Req = {
      method,
      path: sandboxPath(id, `/ports/${checkPort(port)}/http/${p.replace(/^\/+/, "")}`),
      headers,
      expect: ANY_STATUS,
      sandbox: id,
      idempotent: ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"].includes(method),
      accept: headers["accept"] ?? "*/*",
    };
    if (query) req.query = query;
    if (init.body !== undefined && init.body !== null) {
      req.body = init.body;
      req.contentType = headers["content-type"] ?? "application/octet-stream";
    }
    if (init.signal) req.signal = init.signal;
    const resp = await this.#ref.http.stream(req);
    if (resp.headers.has(GUEST_HEADER) || resp.status < 400) return resp;
    throw errorFromResponse(resp.status, new Uint8Array(await resp.arrayBuffer()));
  }
}

function splitQuery(path: string): [string, [string, string][] | undefined] {
  const i = path.indexOf("?");
  if (i < 0) return [path, undefined];
  return [path.slice(0, i), [...new URLSearchParams(path.slice(i + 1))]];
}

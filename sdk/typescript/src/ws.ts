// WebSocket plumbing for exec/ws and attach. In Node the `ws` package is
// used when it is installed (an optional dependency): it sends the
// Authorization header and reports a refused handshake's status and body,
// so a 401 fetches a new data-plane token and a 404 or 409 becomes its
// typed error. Without it, globalThis.WebSocket (Node 22+, browsers) is
// used: Node's passes the header through undici's init object; a browser
// cannot send it (see README: WebSockets in browsers).

import { errorFromResponse, SpaceError, UnavailableError } from "./errors.js";
import type { Http } from "./http.js";

/** Stream bytes of binary messages (api.StreamStdin/Stdout/Stderr). */
export const STDIN = 0;
export const STDOUT = 1;
export const STDERR = 2;
const MAX_MESSAGE = 64 << 20;

/**
 * WebSocketImpl chooses the WebSocket client: "auto" (the `ws` package when
 * installed, else globalThis.WebSocket), "ws", "native", or a constructor.
 */
export type WebSocketImpl = "auto" | "ws" | "native" | (new (url: string, ...rest: any[]) => any);

export type Message = string | Uint8Array;

/** WSConn is a connected WebSocket whose messages are read with recv. */
export interface WSConn {
  send(msg: Message): Promise<void>;
  sendJSON(doc: unknown): Promise<void>;
  /** recv returns the next message, or undefined once the socket closed. */
  recv(): Promise<Message | undefined>;
  /** closeReason says why the socket closed (after recv returned undefined). */
  readonly closeReason: string;
  close(): void;
}

class Queue {
  readonly items: Message[] = [];
  waiters: ((m: Message | undefined) => void)[] = [];
  closed = false;
  closeReason = "";

  push(m: Message): void {
    const w = this.waiters.shift();
    if (w) w(m);
    else this.items.push(m);
  }

  end(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    this.closeReason = reason;
    for (const w of this.waiters.splice(0)) w(undefined);
  }

  recv(): Promise<Message | undefined> {
    const m = this.items.shift();
    if (m !== undefined) return Promise.resolve(m);
    if (this.closed) return Promise.resolve(undefined);
    return new Promise((r) => this.waiters.push(r));
  }
}

function wsURL(base: string, path: string): string {
  return base.replace(/^http(s?):\/\//, "ws$1://") + path;
}

let wsModule: Promise<any> | undefined;

async function loadWs(required: boolean): Promise<any> {
  wsModule ??= import("ws").then(
    (m) => m.WebSocket ?? m.default,
    () => undefined,
  );
  const ws = await wsModule;
  if (!ws && required) throw new Error("the ws package is not installed (npm install ws)");
  return ws;
}

class HandshakeError extends Error {
  constructor(readonly status: number | undefined, readonly body: string, message: string) {
    super(message);
  }
}

async function openWs(WS: any, url: string, token: string, timeoutMs: number): Promise<WSConn> {
  const q = new Queue();
  const headers: Record<string, string> = token ? { Authorization: "Bearer " + token } : {};
  const sock = new WS(url, { headers, perMessageDeflate: false, maxPayload: MAX_MESSAGE, handshakeTimeout: timeoutMs });
  await new Promise<void>((resolve, reject) => {
    sock.once("open", resolve);
    sock.once("unexpected-response", (_req: unknown, res: any) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        reject(new HandshakeError(res.statusCode, Buffer.concat(chunks).toString("utf8"), `HTTP ${res.statusCode}`));
        sock.terminate?.();
      });
      res.on("error", () => reject(new HandshakeError(res.statusCode, "", `HTTP ${res.statusCode}`)));
    });
    sock.once("error", (err: Error) => reject(new HandshakeError(undefined, "", err.message)));
  });
  sock.on("message", (data: Buffer | ArrayBuffer | Buffer[], isBinary: boolean) => {
    const buf = Array.isArray(data) ? Buffer.concat(data) : Buffer.isBuffer(data) ? data : Buffer.from(data);
    q.push(isBinary ? new Uint8Array(buf.buffer, buf.byteOffset, buf.length) : buf.toString("utf8"));
  });
  sock.on("close", (code: number, reason: Buffer) => q.end(`code ${code}${reason?.length ? " " + reason.toString() : ""}`));
  sock.on("error", (err: Error) => q.end(err.message));
  const send = (msg: Message) =>
    new Promise<void>((resolve, reject) => sock.send(msg, { binary: typeof msg !== "string" }, (err?: Error) => (err ? reject(err) : resolve())));
  return {
    send,
    sendJSON: (doc) => send(JSON.stringify(doc)),
    recv: () => q.recv(),
    get closeReason() {
      return q.closeReason;
    },
    close: () => {
      try {
        sock.close();
      } catch {
        // closing a broken socket
      }
      q.end("closed by the client");
    },
  };
}

async function openNative(WS: any, url: string, token: string, timeoutMs: number): Promise<WSConn> {
  const q = new Queue();
  const inNode = typeof process !== "undefined" && !!process.versions?.node;
  // undici's WebSocket takes an init object with headers; a browser's cannot send any.
  const sock = inNode && token ? new WS(url, { headers: { Authorization: "Bearer " + token } }) : new WS(url);
  sock.binaryType = "arraybuffer";
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new HandshakeError(undefined, "", "handshake timed out"));
      sock.close();
    }, timeoutMs);
    sock.addEventListener("open", () => (clearTimeout(timer), resolve()), { once: true });
    sock.addEventListener(
      "error",
      () => (clearTimeout(timer), reject(new HandshakeError(undefined, "", "handshake failed"))),
      { once: true },
    );
  });
  sock.addEventListener("message", (ev: { data: unknown }) => {
    const d = ev.data;
    if (typeof d === "string") q.push(d);
    else if (d instanceof ArrayBuffer) q.push(new Uint8Array(d));
    else if (ArrayBuffer.isView(d)) q.push(new Uint8Array(d.buffer, d.byteOffset, d.byteLength));
  });
  sock.addEventListener("close", (ev: { code: number; reason: string }) => q.end(`code ${ev.code}${ev.reason ? " " + ev.reason : ""}`));
  sock.addEventListener("error", () => q.end("socket error"));
  const send = async (msg: Message) => {
    sock.send(msg);
    // Let a large stdin drain instead of buffering it all.
    while (sock.bufferedAmount > 8 << 20 && sock.readyState === 1) await new Promise((r) => setTimeout(r, 10));
  };
  return {
    send,
    sendJSON: (doc) => send(JSON.stringify(doc)),
    recv: () => q.recv(),
    get closeReason() {
      return q.closeReason;
    },
    close: () => {
      try {
        sock.close();
      } catch {
        // closing a broken socket
      }
      q.end("closed by the client");
    },
  };
}

/**
 * wsConnect opens a WebSocket to a sandbox's data-plane route, fetching a
 * new data-plane token once when the data plane refuses the one it has.
 */
export async function wsConnect(http: Http, impl: WebSocketImpl, sandbox: string, path: string): Promise<WSConn> {
  let open: (url: string, token: string, timeoutMs: number) => Promise<WSConn>;
  if (typeof impl === "function") {
    const C = impl;
    open = "on" in C.prototype && "terminate" in C.prototype ? (u, t, ms) => openWs(C, u, t, ms) : (u, t, ms) => openNative(C, u, t, ms);
  } else {
    const WS = impl === "native" ? undefined : await loadWs(impl === "ws");
    if (WS) open = (u, t, ms) => openWs(WS, u, t, ms);
    else if (typeof (globalThis as any).WebSocket === "function") open = (u, t, ms) => openNative((globalThis as any).WebSocket, u, t, ms);
    else throw new Error("no WebSocket client: install the ws package (npm install ws) or use Node 22+");
  }
  const timeoutMs = Math.min(http.cfg.timeoutMs, 60_000);
  for (let attempt = 0; ; attempt++) {
    const [base, auth] = await http.route(sandbox);
    try {
      return await open(wsURL(base, path), auth, timeoutMs);
    } catch (err) {
      if (!(err instanceof HandshakeError)) throw err;
      if (err.status === 401 && attempt === 0 && auth !== http.cfg.apiKey) {
        http.router.forget(sandbox);
        continue;
      }
      if (err.status === undefined) throw new UnavailableError("unavailable", `websocket ${path}: ${err.message}`);
      throw errorFromResponse(err.status, err.body);
    }
  }
}

export { SpaceError };

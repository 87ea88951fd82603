// The entry point: Space, a client of one SPACE server.

import type { CommandHandle } from "./commands.js";
import { Http, makeConfig } from "./http.js";
import { APIKeys, Quotas, Secrets, Snapshots, Templates, Workers } from "./management.js";
import { Sandboxes } from "./sandbox.js";
import type { Health } from "./types.js";
import type { WebSocketImpl } from "./ws.js";

export interface SpaceOptions {
  /** The server (default $SPACE_API_URL, else http://127.0.0.1:7070). */
  apiUrl?: string | undefined;
  /** An API key (default $SPACE_API_KEY). */
  apiKey?: string | undefined;
  /** Bounds each ordinary request; streams (exec, downloads, builds) are bounded only until their headers (default 300 000). */
  timeoutMs?: number | undefined;
  /** Retries of idempotent requests answered 429 or 503 (default 4). */
  maxRetries?: number | undefined;
  /** The fetch to use (default globalThis.fetch). */
  fetch?: typeof fetch | undefined;
  /** The WebSocket client: "auto" (default), "ws", "native" or a constructor. */
  webSocket?: WebSocketImpl | undefined;
}

/**
 * Space is a client of one SPACE server. close() (or `await using`) ends
 * the WebSocket sessions it has open; HTTP needs no closing.
 */
export class Space {
  readonly sandboxes: Sandboxes;
  readonly templates: Templates;
  readonly snapshots: Snapshots;
  readonly apiKeys: APIKeys;
  readonly secrets: Secrets;
  readonly quota: Quotas;
  readonly workers: Workers;
  /** @internal */
  readonly http: Http;
  /** @internal */
  readonly webSocket: WebSocketImpl;
  /** @internal Open WebSocket sessions (background commands, PTYs). */
  readonly sessions = new Set<CommandHandle>();

  constructor(opts: SpaceOptions = {}) {
    this.http = new Http(makeConfig(opts));
    this.webSocket = opts.webSocket ?? "auto";
    this.sandboxes = new Sandboxes(this, this.http);
    this.templates = new Templates(this.http);
    this.snapshots = new Snapshots(this.http);
    this.apiKeys = new APIKeys(this.http);
    this.secrets = new Secrets(this.http);
    this.quota = new Quotas(this.http);
    this.workers = new Workers(this.http);
  }

  get apiUrl(): string {
    return this.http.cfg.apiUrl;
  }

  /** health reports that the server is up (needs no key). */
  health(): Promise<Health> {
    return this.http.json<Health>({ method: "GET", path: "/v1/health", idempotent: true });
  }

  /**
   * close drops the WebSocket sessions still open, as a client that goes
   * away would: their commands run on unless started with killOnDisconnect.
   */
  async close(): Promise<void> {
    await Promise.all([...this.sessions].map((h) => h.drop()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

// Templates, snapshots, API keys, secrets, quota and workers (the management API).

import { toBytes } from "./bytes.js";
import { b64encode } from "./bytes.js";
import { errorFromEvent, StreamCutError, TemplateBuildError } from "./errors.js";
import { esc, ndjson, type BodyData, type Http } from "./http.js";
import type { APIKey, BuildEvent, BuildReport, QuotaUsage, Secret, Snapshot, Template, Worker } from "./types.js";

/** Templates is space.templates. */
export class Templates {
  readonly #http: Http;

  /** @internal */
  constructor(http: Http) {
    this.#http = http;
  }

  /** list lists the built-in templates, then every version of the team's. */
  async list(): Promise<Template[]> {
    return (await this.#http.json<{ templates: Template[] }>({ method: "GET", path: "/v1/templates", idempotent: true })).templates ?? [];
  }

  /** get returns a template's versions ("name") or one version ("name:version"). */
  async get(ref: string): Promise<Template[]> {
    return (await this.#http.json<{ templates: Template[] }>({ method: "GET", path: "/v1/templates/" + esc(ref), idempotent: true })).templates ?? [];
  }

  /** delete deletes a template's versions ("name") or one version ("name:version"). */
  async delete(ref: string): Promise<void> {
    await this.#http.send({ method: "DELETE", path: "/v1/templates/" + esc(ref), expect: [200, 204], idempotent: true });
  }

  /**
   * build builds a template version from a build context: a tar archive
   * (bytes or a stream; tar() makes one) holding the spec file and what it
   * refers to. onEvent sees every BuildEvent as it arrives. A failed build
   * throws TemplateBuildError.
   */
  async build(
    context: BodyData,
    opts: { file?: string; name?: string; onEvent?: (ev: BuildEvent) => void | Promise<void>; signal?: AbortSignal } = {},
  ): Promise<{ template: Template; report: BuildReport }> {
    const query: [string, string][] = [];
    if (opts.file) query.push(["file", opts.file]);
    if (opts.name) query.push(["name", opts.name]);
    const resp = await this.#http.stream({
      method: "POST",
      path: "/v1/templates",
      query,
      body: context,
      contentType: "application/x-tar",
      accept: "application/x-ndjson",
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    if (!resp.body) throw new StreamCutError("build stream ended before its done or error event");
    for await (const raw of ndjson(resp.body, "build")) {
      const ev = raw as BuildEvent;
      if (ev.type === "error") throw new TemplateBuildError(errorFromEvent(ev.error), ev.report);
      await opts.onEvent?.(ev);
      if (ev.type === "done") {
        return {
          template: ev.template ?? { name: "", state: "ready", created_at: "" },
          report: ev.report ?? { steps: 0, executed: 0, cached: 0, snapshots: 0, duration_ms: 0 },
        };
      }
    }
    throw new StreamCutError("build stream ended before its done or error event");
  }
}

/** Snapshots is space.snapshots. */
export class Snapshots {
  readonly #http: Http;

  /** @internal */
  constructor(http: Http) {
    this.#http = http;
  }

  /** list lists the team's snapshots, or one sandbox's. */
  async list(filter: { sandbox?: string } = {}): Promise<Snapshot[]> {
    const query: [string, string][] = filter.sandbox ? [["sandbox", filter.sandbox]] : [];
    return (await this.#http.json<{ snapshots: Snapshot[] }>({ method: "GET", path: "/v1/snapshots", query, idempotent: true })).snapshots ?? [];
  }

  /** get returns a snapshot by ID or name. */
  get(ref: string): Promise<Snapshot> {
    return this.#http.json<Snapshot>({ method: "GET", path: "/v1/snapshots/" + esc(ref), idempotent: true });
  }

  async delete(ref: string): Promise<void> {
    await this.#http.send({ method: "DELETE", path: "/v1/snapshots/" + esc(ref), expect: [200, 204], idempotent: true });
  }
}

/** APIKeys is space.apiKeys. */
export class APIKeys {
  readonly #http: Http;

  /** @internal */
  constructor(http: Http) {
    this.#http = http;
  }

  /** create makes a key; its `secret` is only in this reply. Another team's key needs an admin key. */
  create(name?: string, opts: { team?: string; admin?: boolean } = {}): Promise<APIKey> {
    const body: Record<string, unknown> = {};
    if (name) body.name = name;
    if (opts.team) body.team = opts.team;
    if (opts.admin) body.admin = true;
    return this.#http.json<APIKey>({ method: "POST", path: "/v1/apikeys", json: body, expect: [201] });
  }

  async list(opts: { team?: string } = {}): Promise<APIKey[]> {
    const query: [string, string][] = opts.team ? [["team", opts.team]] : [];
    return (await this.#http.json<{ keys: APIKey[] }>({ method: "GET", path: "/v1/apikeys", query, idempotent: true })).keys ?? [];
  }

  /** delete revokes a key; another team's (admin keys) needs its team. */
  async delete(id: string, opts: { team?: string } = {}): Promise<void> {
    const query: [string, string][] = opts.team ? [["team", opts.team]] : [];
    await this.#http.send({ method: "DELETE", path: "/v1/apikeys/" + esc(id), query, expect: [200, 204], idempotent: true });
  }
}

/** Secrets is space.secrets. */
export class Secrets {
  readonly #http: Http;

  /** @internal */
  constructor(http: Http) {
    this.#http = http;
  }

  /**
   * create stores a team secret that sandboxes granted it send to hosts,
   * in header (default Authorization) as format (default "Bearer {}").
   */
  create(name: string, value: string | Uint8Array, hosts: string[], opts: { header?: string; format?: string } = {}): Promise<Secret> {
    const body: Record<string, unknown> = { name, value: b64encode(toBytes(value)), hosts: [...hosts] };
    if (opts.header !== undefined) body.header = opts.header;
    if (opts.format !== undefined) body.format = opts.format;
    return this.#http.json<Secret>({ method: "POST", path: "/v1/secrets", json: body, expect: [201] });
  }

  async list(): Promise<Secret[]> {
    return (await this.#http.json<{ secrets: Secret[] }>({ method: "GET", path: "/v1/secrets", idempotent: true })).secrets ?? [];
  }

  async delete(name: string): Promise<void> {
    await this.#http.send({ method: "DELETE", path: "/v1/secrets/" + esc(name), expect: [200, 204], idempotent: true });
  }
}

/** QuotaLimits are a team's limits; 0 means unlimited. */
export interface QuotaLimits {
  sandboxes?: number;
  vcpus?: number;
  memoryMib?: number;
  snapshotMib?: number;
}

/** Quotas is space.quota. */
export class Quotas {
  readonly #http: Http;

  /** @internal */
  constructor(http: Http) {
    this.#http = http;
  }

  /** get returns the limits and usage of the caller's team (another team's: admin key). */
  get(opts: { team?: string } = {}): Promise<QuotaUsage> {
    const query: [string, string][] = opts.team ? [["team", opts.team]] : [];
    return this.#http.json<QuotaUsage>({ method: "GET", path: "/v1/quota", query, idempotent: true });
  }

  /** set replaces a team's limits (admin key); a limit left out or 0 is unlimited. */
  set(limits: QuotaLimits & { team?: string }): Promise<QuotaUsage> {
    const query: [string, string][] = limits.team ? [["team", limits.team]] : [];
    const body = {
      sandboxes: limits.sandboxes ?? 0,
      vcpus: limits.vcpus ?? 0,
      memory_mib: limits.memoryMib ?? 0,
      snapshot_mib: limits.snapshotMib ?? 0,
    };
    return this.#http.json<QuotaUsage>({ method: "PUT", path: "/v1/quota", query, json: body, idempotent: true });
  }
}

/** Workers is space.workers (admin key). */
export class Workers {
  readonly #http: Http;

  /** @internal */
  constructor(http: Http) {
    this.#http = http;
  }

  async list(): Promise<Worker[]> {
    return (await this.#http.json<{ workers: Worker[] }>({ method: "GET", path: "/v1/workers", idempotent: true })).workers ?? [];
  }
}

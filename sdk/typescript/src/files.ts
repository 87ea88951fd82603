// A sandbox's file system: sandbox.files. Bodies are raw bytes
// (application/octet-stream); a write replaces a file atomically. Paths are
// absolute paths in the sandbox.

import { NotFoundError, StreamCutError, errorFromEvent } from "./errors.js";
import { ndjson, sandboxPath, type BodyData, type Http, type Req } from "./http.js";
import type { SandboxRef } from "./commands.js";
import type { FileEvent, FileInfo, FileWritten, TarWritten } from "./types.js";

/** METADATA_HEADER prefixes the headers that set a written file's metadata. */
const METADATA_HEADER = "X-Space-Metadata-";

function q(path: string, ...extra: [string, string][]): [string, string][] {
  if (!path.startsWith("/")) throw new TypeError(`path ${JSON.stringify(path)}: want an absolute path`);
  return [["path", path], ...extra];
}

export interface WriteOptions {
  /** Permission bits, e.g. 0o755 (default 0o644). */
  mode?: number;
  /** Create missing parent directories (default true). */
  mkdir?: boolean;
  /** The user (a name in the sandbox, or a uid) who owns the file and the directories made for it (default root). */
  owner?: string;
  /** The file's metadata, kept as its user extended attributes (keys of letters, digits, ".", "_", "-"). */
  metadata?: Record<string, string>;
}

/**
 * FileWatch is a watch of a directory (sandbox.files.watch): iterate it
 * for its changes, and close it when done.
 */
export interface FileWatch extends AsyncIterable<FileEvent> {
  close(): void;
}

/** Files is sandbox.files. */
export class Files {
  readonly #ref: SandboxRef;

  /** @internal */
  constructor(ref: SandboxRef) {
    this.#ref = ref;
  }

  get #http(): Http {
    return this.#ref.http;
  }

  #req(method: string, route: string, query: [string, string][], more: Partial<Req> = {}): Req {
    const id = this.#ref.id;
    return { method, path: sandboxPath(id, route), query, sandbox: id, idempotent: true, ...more };
  }

  /** read returns the file's bytes. */
  async read(path: string): Promise<Uint8Array> {
    return (await this.#http.send(this.#req("GET", "/files", q(path), { accept: "application/octet-stream" }))).body;
  }

  /** readText returns the file decoded as UTF-8. */
  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.read(path));
  }

  /**
   * readStream returns the file's bytes as a stream, for large files (in
   * Node, stream.Readable.fromWeb makes a Node stream of it).
   */
  async readStream(path: string): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.#http.stream(this.#req("GET", "/files", q(path), { accept: "application/octet-stream" }));
    return resp.body ?? new ReadableStream({ start: (c) => c.close() });
  }

  /**
   * write creates or replaces the file (atomically) with data: a string
   * (UTF-8), bytes, a Blob, or a stream (a ReadableStream, a Node
   * stream.Readable or any async iterable of bytes), which is streamed.
   */
  async write(path: string, data: BodyData, opts: WriteOptions = {}): Promise<FileWritten> {
    const extra: [string, string][] = [];
    if (opts.mode !== undefined) extra.push(["mode", "0" + (opts.mode & 0o7777).toString(8).padStart(3, "0")]);
    if (opts.mkdir ?? true) extra.push(["mkdir", "true"]);
    if (opts.owner) extra.push(["owner", opts.owner]);
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(opts.metadata ?? {})) headers[METADATA_HEADER + k] = v;
    return this.#http.json<FileWritten>(this.#req("PUT", "/files", q(path, ...extra), { body: data, contentType: "application/octet-stream", headers }));
  }

  /** stat describes the file at path (a symlink itself, with its target): owner, permissions, metadata. */
  async stat(path: string): Promise<FileInfo> {
    return this.#http.json<FileInfo>(this.#req("GET", "/files/stat", q(path)));
  }

  /** list returns a directory's entries. */
  async list(path: string): Promise<FileInfo[]> {
    const doc = await this.#http.json<{ entries?: FileInfo[] }>(this.#req("GET", "/files/list", q(path)));
    return doc.entries ?? [];
  }

  /** exists tells whether path names a file, directory or link. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** remove removes a file, or a directory (with recursive, and what is in it). */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    const extra: [string, string][] = opts.recursive ? [["recursive", "true"]] : [];
    await this.#http.send(this.#req("DELETE", "/files", q(path, ...extra), { expect: [200, 204] }));
  }

  /**
   * makeDir creates a directory (and its parents unless parents: false,
   * owned by owner when given) and tells whether it made it: false when it
   * was a directory already. Another kind of file in its place throws a
   * ConflictError.
   */
  async makeDir(path: string, opts: { parents?: boolean; owner?: string } = {}): Promise<boolean> {
    q(path);
    const resp = await this.#http.send(this.#req("POST", "/files/mkdir", [], {
      json: { path, parents: opts.parents ?? true, ...(opts.owner ? { owner: opts.owner } : {}) }, expect: [200, 201],
    }));
    return resp.status === 201;
  }

  /** move renames from to to (making to's missing parents) and describes to. */
  async move(from: string, to: string): Promise<FileInfo> {
    q(from);
    q(to);
    return this.#http.json<FileInfo>(this.#req("POST", "/files/move", [], { json: { from, to }, idempotent: false }));
  }

  /**
   * watch watches a directory (recursive: the directories below it too,
   * including ones made later) and resolves once it is watched: every
   * change after that is an event of the returned FileWatch, until it is
   * closed or the directory itself goes (its remove or rename event comes
   * last). An "overflow" event says changes were lost.
   */
  async watch(path: string, opts: { recursive?: boolean } = {}): Promise<FileWatch> {
    const ctl = new AbortController();
    const extra: [string, string][] = opts.recursive ? [["recursive", "true"]] : [];
    const resp = await this.#http.stream(this.#req("GET", "/files/watch", q(path, ...extra), { accept: "application/x-ndjson", signal: ctl.signal }));
    if (!resp.body) throw new StreamCutError("watch: no body");
    const lines = ndjson(resp.body, "watch");
    const first = (await lines.next()).value as FileEvent | undefined;
    if (first?.type !== "start") {
      ctl.abort();
      if (first?.type === "error") throw errorFromEvent(first.error);
      throw new StreamCutError(`watch ${path}: the stream did not start`);
    }
    let closed = false;
    async function* events(): AsyncGenerator<FileEvent> {
      try {
        for await (const line of lines) {
          const ev = line as FileEvent;
          if (ev.type === "error") throw errorFromEvent(ev.error);
          yield ev;
          if (ev.name === "." && (ev.type === "remove" || ev.type === "rename")) return;
        }
        if (!closed) throw new StreamCutError(`watch ${path}: the stream ended`);
      } catch (err) {
        if (closed) return;
        throw err;
      } finally {
        ctl.abort();
      }
    }
    return {
      [Symbol.asyncIterator]: events,
      close() {
        closed = true;
        ctl.abort();
      },
    };
  }

  /**
   * readTar returns the directory's tree as a tar archive, as the sandbox
   * sent it: owners, setuid bits, fifos, devices and links included. Treat
   * it as hostile when unpacking it on the host (untar() returns only
   * regular files with names that stay inside; elsewhere drop owners,
   * setuid/setgid/sticky bits, special files and names that leave the
   * directory, as `space file get -r` does).
   */
  async readTar(path: string): Promise<Uint8Array> {
    return (await this.#http.send(this.#req("GET", "/files/tar", q(path), { accept: "application/x-tar" }))).body;
  }

  /** readTarStream returns the directory's tree as a tar stream. */
  async readTarStream(path: string): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.#http.stream(this.#req("GET", "/files/tar", q(path), { accept: "application/x-tar" }));
    return resp.body ?? new ReadableStream({ start: (c) => c.close() });
  }

  /**
   * writeTar unpacks a tar archive (bytes or a stream) into the directory,
   * all or nothing; mkdir (default true) creates missing parents.
   */
  async writeTar(path: string, archive: BodyData, opts: { mkdir?: boolean } = {}): Promise<TarWritten> {
    const extra: [string, string][] = (opts.mkdir ?? true) ? [["mkdir", "true"]] : [];
    return this.#http.json<TarWritten>(this.#req("PUT", "/files/tar", q(path, ...extra), { body: archive, contentType: "application/x-tar" }));
  }
}

// A small tar (ustar with PAX long names) writer, for build contexts and
// files.writeTar callers that have files in memory.

import { concat } from "./http.js";

/** TarEntry is one entry of tar(): a file (data) or a directory (no data). */
export interface TarEntry {
  /** The name inside the archive, e.g. "space.yaml" or "src/app.py"; a directory may end in "/". */
  name: string;
  data?: string | Uint8Array;
  /** Permission bits (default 0o644 for files, 0o755 for directories). */
  mode?: number;
}

const enc = new TextEncoder();

function header(name: string, size: number, mode: number, type: string): Uint8Array {
  const h = new Uint8Array(512);
  const put = (s: string, off: number, len: number) => h.set(enc.encode(s).subarray(0, len), off);
  const oct = (n: number, len: number) => n.toString(8).padStart(len - 1, "0") + "\0";
  put(name, 0, 100);
  put(oct(mode, 8), 100, 8);
  put(oct(0, 8), 108, 8);
  put(oct(0, 8), 116, 8);
  put(oct(size, 12), 124, 12);
  put(oct(Math.floor(Date.now() / 1000), 12), 136, 12);
  put("        ", 148, 8);
  put(type, 156, 1);
  put("ustar\u000000", 257, 8);
  let sum = 0;
  for (const b of h) sum += b;
  put(sum.toString(8).padStart(6, "0") + "\0 ", 148, 8);
  return h;
}

function pad(n: number): Uint8Array {
  return new Uint8Array((512 - (n % 512)) % 512);
}

/** tar returns a tar archive of the entries. */
export function tar(entries: TarEntry[]): Uint8Array {
  const parts: Uint8Array[] = [];
  for (const e of entries) {
    const dir = e.data === undefined;
    const name = dir && !e.name.endsWith("/") ? e.name + "/" : e.name;
    const data = dir ? new Uint8Array() : typeof e.data === "string" ? enc.encode(e.data) : e.data!;
    if (enc.encode(name).length > 99) {
      const rec = paxRecord("path", name);
      parts.push(header("././@PaxHeader", rec.length, 0o644, "x"), rec, pad(rec.length));
    }
    parts.push(header(name, data.length, e.mode ?? (dir ? 0o755 : 0o644), dir ? "5" : "0"), data, pad(data.length));
  }
  parts.push(new Uint8Array(1024));
  return concat(parts);
}

function paxRecord(key: string, value: string): Uint8Array {
  const body = ` ${key}=${value}\n`;
  let n = enc.encode(body).length;
  let len = n + String(n).length;
  if (String(len).length !== String(n).length) len = n + String(len).length;
  return enc.encode(`${len}${body}`);
}

/**
 * untar lists the regular files of a tar archive (for tests and small
 * archives), by name relative to the archive's root. It keeps only names
 * that stay below that root: absolute names and names with a ".." element
 * (which a hostile sandbox may send) are left out, so joining a name to a
 * directory stays inside it. Modes, owners, links, fifos and devices are
 * not returned at all.
 */
export function untar(archive: Uint8Array): Map<string, Uint8Array> {
  const files = new Map<string, Uint8Array>();
  const dec = new TextDecoder();
  let longName: string | undefined;
  for (let off = 0; off + 512 <= archive.length; ) {
    const h = archive.subarray(off, off + 512);
    if (h.every((b) => b === 0)) break;
    const str = (a: number, l: number) => dec.decode(h.subarray(a, a + l)).replace(/\0.*$/s, "");
    const size = parseInt(str(124, 12).trim() || "0", 8);
    const type = str(156, 1) || "0";
    const prefix = str(345, 155);
    const name = longName ?? (prefix ? prefix + "/" + str(0, 100) : str(0, 100));
    longName = undefined;
    const data = archive.subarray(off + 512, off + 512 + size);
    if (type === "x") {
      const m = /\d+ path=([^\n]*)\n/.exec(dec.decode(data));
      if (m) longName = m[1];
    } else if (type === "0") {
      const rel = name.replace(/^(\.\/)+/, "");
      if (insideRoot(rel)) files.set(rel, data);
    }
    off += 512 + size + ((512 - (size % 512)) % 512);
  }
  return files;
}

/** insideRoot reports whether a relative archive name stays below the archive's root. */
function insideRoot(name: string): boolean {
  return name !== "" && !name.startsWith("/") && !name.includes("\0") && !name.split("/").includes("..");
}

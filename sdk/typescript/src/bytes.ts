// Base64 and byte helpers that work in Node and in browsers.

const hasBuffer = typeof (globalThis as any).Buffer === "function";

export function b64decode(s: string): Uint8Array {
  if (hasBuffer) {
    const b = (globalThis as any).Buffer.from(s, "base64") as Uint8Array;
    return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  }
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export function b64encode(b: Uint8Array): string {
  if (hasBuffer) return (globalThis as any).Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");
  let bin = "";
  for (let i = 0; i < b.length; i += 0x8000) bin += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(bin);
}

/** toBytes encodes a string as UTF-8; bytes pass through. */
export function toBytes(data: string | Uint8Array | ArrayBuffer): Uint8Array {
  if (typeof data === "string") return new TextEncoder().encode(data);
  return data instanceof ArrayBuffer ? new Uint8Array(data) : data;
}

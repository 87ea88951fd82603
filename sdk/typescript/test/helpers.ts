// Shared set-up of the tests, which run against a real SPACE server named
// by SPACE_API_URL and SPACE_API_KEY (an admin key); run-tests.sh starts one.
// The machine has 2 cores: sandboxes are 256 MiB, and a test file keeps one
// shared sandbox plus at most one of a test's own alive.

import { randomBytes } from "node:crypto";
import { after, before } from "node:test";
import { Sandbox, Space, type CreateOptions } from "space-sdk";

export const RUN = randomBytes(4).toString("hex");
export const LABELS = { "sdk-test": RUN };
export const hasServer = !!process.env.SPACE_API_URL && !!process.env.SPACE_API_KEY;
/** skip is the reason a test that needs a server skips, or false. */
export const skip = hasServer ? false : "needs a server: SPACE_API_URL and SPACE_API_KEY (run-tests.sh)";

/** sandboxArgs returns create options of a test sandbox: small, labelled, short-lived. */
export function sandboxArgs(o: CreateOptions = {}): CreateOptions {
  return { memoryMib: 256, timeoutMs: 1_800_000, ...o, labels: { ...LABELS, ...(o.labels ?? {}) } };
}

/**
 * useServer gives a file a Space and a shared sandbox, made before its
 * tests and deleted after them (with whatever a failed test left behind).
 */
export function useServer(opts: { shared?: boolean } = {}): { space: Space; shared: () => Sandbox } {
  const space = hasServer ? new Space() : (undefined as unknown as Space);
  let sb: Sandbox | undefined;
  if (hasServer) {
    before(async () => {
      if (opts.shared) sb = await space.sandboxes.create(sandboxArgs());
    });
    after(async () => {
      for (const s of await space.sandboxes.list({ labels: LABELS })) await s.delete({ missingOk: true });
      await space.close();
    });
  }
  return {
    space,
    shared: () => {
      if (!sb) throw new Error("setup: no shared sandbox");
      return sb;
    },
  };
}

/** waitFor polls cond every 100 ms until it holds; it throws after timeoutMs. */
export async function waitFor(cond: () => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 100));
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

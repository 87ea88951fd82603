// Terminal sessions: sandbox.pty (exec/ws with tty set). A terminal's
// output is all stdout and raw bytes: onData gets Uint8Array.

import { buildExec, CommandHandle, Output, type Cmd, type SandboxRef } from "./commands.js";
import { sandboxPath } from "./http.js";
import { STDOUT } from "./ws.js";

const DEFAULT_SHELL = ["/bin/bash", "-i"];

/** PtyHandle is a command on a terminal: sendInput, resize, wait, kill. */
export class PtyHandle extends CommandHandle {
  async sendInput(data: string | Uint8Array): Promise<void> {
    await this.sendStdin(data);
  }

  /** output is everything the terminal printed so far. */
  get output(): Uint8Array {
    return this.out.bytes(STDOUT);
  }
}

export interface PtyOptions {
  cols?: number;
  rows?: number;
  /** Called with each piece of terminal output as it arrives. */
  onData?: (data: Uint8Array) => void | Promise<void>;
  /** The command (default an interactive bash). */
  cmd?: Cmd;
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
}

/** Pty is sandbox.pty. */
export class Pty {
  readonly #ref: SandboxRef;

  /** @internal */
  constructor(ref: SandboxRef) {
    this.#ref = ref;
  }

  /** create starts cmd (default an interactive bash) on a cols x rows terminal (80 x 24). */
  async create(opts: PtyOptions = {}): Promise<PtyHandle> {
    const ex = buildExec(
      opts.cmd ?? DEFAULT_SHELL,
      {
        env: { TERM: "xterm-256color", ...(opts.env ?? {}) },
        ...(opts.cwd ? { cwd: opts.cwd } : {}),
        ...(opts.user ? { user: opts.user } : {}),
        ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}),
        tty: { rows: Math.trunc(opts.rows ?? 24), cols: Math.trunc(opts.cols ?? 80) },
      },
      false,
    );
    const out = new Output(opts.onData, undefined, false);
    return PtyHandle.open(this.#ref, sandboxPath(this.#ref.id, "/exec/ws"), ex, out);
  }
}

// space-sdk: the TypeScript SDK of SPACE (disposable micro-VM sandboxes).

export { Space, type SpaceOptions } from "./client.js";
export { Sandbox, Sandboxes, type CreateOptions, type NetworkArg } from "./sandbox.js";
export { Commands, CommandHandle, CommandResult, type Cmd, type OutputCallback, type RunOptions } from "./commands.js";
export { Pty, PtyHandle, type PtyOptions } from "./pty.js";
export { Files, type WriteOptions } from "./files.js";
export { Ports, type PortRequestInit } from "./ports.js";
export { APIKeys, Quotas, Secrets, Snapshots, Templates, Workers, type QuotaLimits } from "./management.js";
export { tar, untar, type TarEntry } from "./tar.js";
export type { BodyData } from "./http.js";
export type { WebSocketImpl } from "./ws.js";
export {
  AuthenticationError,
  CommandExitError,
  ConflictError,
  DeadlineExceededError,
  FailedPreconditionError,
  InternalError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  QuotaExceededError,
  RequestTooLargeError,
  SpaceError,
  StreamCutError,
  TemplateBuildError,
  TimeoutError,
  UnavailableError,
  errorFromResponse,
  makeError,
} from "./errors.js";
export type * from "./types.js";

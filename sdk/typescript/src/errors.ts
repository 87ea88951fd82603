// Typed errors: one class per API error code (the table in api/openapi.yaml).

import type { BuildReport, CommandResultLike } from "./types.js";

/**
 * SpaceError is a failure the server reported: an HTTP error status with an
 * Error body, or an `error` event inside a stream (`status` undefined then).
 * `message` is the server's message; `field` names the offending request
 * field when the server says which.
 */
export class SpaceError extends Error {
  readonly code: string;
  readonly field: string | undefined;
  readonly status: number | undefined;

  constructor(code: string, message: string, field?: string, status?: number) {
    super(message || code.replace(/_/g, " "));
    this.name = new.target.name;
    this.code = code;
    this.field = field || undefined;
    this.status = status;
  }

  override toString(): string {
    const msg = this.field ? `${this.field}: ${this.message}` : this.message;
    return this.status
      ? `${this.name}: ${msg} (${this.code}, HTTP ${this.status})`
      : `${this.name}: ${msg} (${this.code})`;
  }
}

/** 400 invalid_argument: the request is malformed; `field` names the culprit. */
export class InvalidArgumentError extends SpaceError {}
/** 401 unauthenticated: no valid API key (or data-plane token). */
export class AuthenticationError extends SpaceError {}
/** 403 permission_denied: the key may not do this (e.g. not an admin key). */
export class PermissionDeniedError extends SpaceError {}
/** 404 not_found: no such object visible to the caller's team. */
export class NotFoundError extends SpaceError {}
/** 409 conflict: the object's state does not allow this. */
export class ConflictError extends SpaceError {}
/** 409 failed_precondition (a ConflictError): e.g. the sandbox is not running. */
export class FailedPreconditionError extends ConflictError {}
/** 413 request_too_large. */
export class RequestTooLargeError extends SpaceError {}
/** 429 resource_exhausted: the team's quota would be exceeded. */
export class QuotaExceededError extends SpaceError {}
/** 503 unavailable, or resource_exhausted with 503 (no worker has capacity). */
export class UnavailableError extends SpaceError {}
/** 504 deadline_exceeded. */
export class DeadlineExceededError extends SpaceError {}
/** 500 internal. */
export class InternalError extends SpaceError {}

/**
 * StreamCutError: an output stream (exec, output, attach, a build) ended
 * before its exit or error event because the connection broke. The command
 * may still run; re-attach with `sandbox.commands.connect(pid)`.
 */
export class StreamCutError extends SpaceError {
  constructor(message = "output stream ended before the command exited") {
    super("stream_cut", message);
  }
}

/** TemplateBuildError: a build that ended with an `error` event; `report` says how far it got. */
export class TemplateBuildError extends SpaceError {
  readonly report: BuildReport | undefined;

  constructor(err: SpaceError, report: BuildReport | undefined) {
    super(err.code, err.message, err.field, err.status);
    this.report = report;
  }
}

/** CommandExitError comes from `commands.run(cmd, { check: true })` for a command that failed. */
export class CommandExitError extends Error {
  readonly result: CommandResultLike;

  constructor(result: CommandResultLike) {
    const tail = result.stderr ? ": " + result.stderr.slice(-500) : "";
    super(`command exited with code ${result.exitCode}${tail}`);
    this.name = "CommandExitError";
    this.result = result;
  }
}

/** TimeoutError: a client-side wait (handle.wait, ports.waitOpen) ran out; nothing was stopped. */
export class TimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TimeoutError";
  }
}

type ErrorClass = new (code: string, message: string, field?: string, status?: number) => SpaceError;

const byCode: Record<string, ErrorClass> = {
  invalid_argument: InvalidArgumentError,
  unauthenticated: AuthenticationError,
  permission_denied: PermissionDeniedError,
  not_found: NotFoundError,
  conflict: ConflictError,
  failed_precondition: FailedPreconditionError,
  request_too_large: RequestTooLargeError,
  resource_exhausted: QuotaExceededError,
  unavailable: UnavailableError,
  deadline_exceeded: DeadlineExceededError,
  internal: InternalError,
};

const codeForStatus: Record<number, string> = {
  400: "invalid_argument",
  401: "unauthenticated",
  403: "permission_denied",
  404: "not_found",
  409: "conflict",
  413: "request_too_large",
  429: "resource_exhausted",
  502: "unavailable",
  503: "unavailable",
  504: "deadline_exceeded",
};

/**
 * makeError returns the SpaceError subclass for code. resource_exhausted
 * with status 503 means "no capacity", not quota: an UnavailableError.
 */
export function makeError(code: string, message: string, field?: string, status?: number): SpaceError {
  const cls = code === "resource_exhausted" && status === 503 ? UnavailableError : (byCode[code] ?? SpaceError);
  return new cls(code, message, field, status);
}

/**
 * errorFromResponse returns the error a failed reply carries; a body that is
 * not an Error document (from a proxy, say) gets a code guessed from the status.
 */
export function errorFromResponse(status: number, body: Uint8Array | string): SpaceError {
  const text = typeof body === "string" ? body : new TextDecoder().decode(body);
  try {
    const doc = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; field?: unknown } };
    const eb = doc && typeof doc === "object" ? doc.error : undefined;
    if (eb && typeof eb === "object" && eb.code) {
      return makeError(String(eb.code), String(eb.message ?? ""), eb.field ? String(eb.field) : undefined, status);
    }
  } catch {
    // not JSON: fall through
  }
  let msg = text.trim();
  if (msg.length > 200) msg = msg.slice(0, 200) + "...";
  return makeError(codeForStatus[status] ?? "internal", msg || `HTTP ${status}`, undefined, status);
}

/** errorFromEvent returns the error of an `error` event in a stream. */
export function errorFromEvent(body: { code?: string; message?: string; field?: string } | undefined): SpaceError {
  if (!body) return new InternalError("internal", "error event without error");
  return makeError(String(body.code ?? "internal"), String(body.message ?? ""), body.field);
}

"""Typed errors: one class per API error code (see the table in api/openapi.yaml)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, Optional, Type

if TYPE_CHECKING:
    from .commands import CommandResult


class SpaceError(Exception):
    """A failure the server reported: an HTTP error status with an Error
    body, or an ``error`` event in an output stream (``status`` None)."""

    def __init__(self, code: str, message: str, field: Optional[str] = None, status: Optional[int] = None) -> None:
        self.code = code
        self.message = message
        self.field = field
        self.status = status
        super().__init__(self._text())

    def _text(self) -> str:
        msg = self.message or self.code.replace("_", " ")
        if self.field:
            msg = "%s: %s" % (self.field, msg)
        if self.status:
            return "%s (%s, HTTP %d)" % (msg, self.code, self.status)
        return "%s (%s)" % (msg, self.code)


class InvalidArgumentError(SpaceError):
    """400 invalid_argument: the request is malformed; ``field`` names the culprit."""


class AuthenticationError(SpaceError):
    """401 unauthenticated: no valid API key."""


class PermissionDeniedError(SpaceError):
    """403 permission_denied: the key may not do this (e.g. not an admin key)."""


class NotFoundError(SpaceError):
    """404 not_found: no such object visible to the caller's team."""


class ConflictError(SpaceError):
    """409 conflict: the object's state does not allow this."""


class FailedPreconditionError(ConflictError):
    """409 failed_precondition: e.g. the sandbox is not running."""


class RequestTooLargeError(SpaceError):
    """413 request_too_large."""


class QuotaExceededError(SpaceError):
    """429 resource_exhausted: the team's quota would be exceeded."""


class UnavailableError(SpaceError):
    """503 unavailable (or resource_exhausted: no worker has capacity)."""


class DeadlineExceededError(SpaceError, TimeoutError):
    """504 deadline_exceeded."""


class InternalError(SpaceError):
    """500 internal."""


class StreamCutError(SpaceError):
    """An output stream ended before its exit or error event: the
    connection broke. The command may still run; re-attach with
    ``sandbox.commands.connect(pid)``."""

    def __init__(self, message: str = "output stream ended before the command exited") -> None:
        super().__init__("stream_cut", message)


class CommandExitError(Exception):
    """Raised by ``commands.run(..., check=True)`` for a non-zero exit."""

    def __init__(self, result: "CommandResult") -> None:
        self.result = result
        super().__init__(
            "command exited with code %d%s" % (result.exit_code, ": " + result.stderr[-500:] if result.stderr else "")
        )


_BY_CODE: Dict[str, Type[SpaceError]] = {
    "invalid_argument": InvalidArgumentError,
    "unauthenticated": AuthenticationError,
    "permission_denied": PermissionDeniedError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "failed_precondition": FailedPreconditionError,
    "request_too_large": RequestTooLargeError,
    "resource_exhausted": QuotaExceededError,
    "unavailable": UnavailableError,
    "deadline_exceeded": DeadlineExceededError,
    "internal": InternalError,
}

_CODE_FOR_STATUS = {
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
}


def make_error(code: str, message: str, field: Optional[str] = None, status: Optional[int] = None) -> SpaceError:
    """The SpaceError subclass for code. resource_exhausted with 503 means
    "no capacity", not quota: it is an UnavailableError."""
    if code == "resource_exhausted" and status == 503:
        cls: Type[SpaceError] = UnavailableError
    else:
        cls = _BY_CODE.get(code, SpaceError)
    return cls(code, message, field, status)


def error_from_response(status: int, body: bytes) -> SpaceError:
    """The error a failed reply carries; a body that is not an Error (from a
    proxy, say) gets a code guessed from the status."""
    try:
        doc: Any = json.loads(body)
        eb = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(eb, dict) and eb.get("code"):
            return make_error(str(eb["code"]), str(eb.get("message", "")), eb.get("field"), status)
    except (ValueError, UnicodeDecodeError):
        pass
    msg = body.decode("utf-8", "replace").strip()
    if len(msg) > 200:
        msg = msg[:200] + "..."
    return make_error(_CODE_FOR_STATUS.get(status, "internal"), msg or "HTTP %d" % status, None, status)


def error_from_event(body: Optional[Dict[str, Any]]) -> SpaceError:
    """The error of an ``error`` event in a stream."""
    if not body:
        return InternalError("internal", "error event without error")
    return make_error(str(body.get("code", "internal")), str(body.get("message", "")), body.get("field"))

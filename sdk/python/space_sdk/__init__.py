"""Python SDK of SPACE: disposable micro-VM sandboxes behind a REST API.

    from space_sdk import Space
    with Space() as space, space.sandboxes.create(memory_mib=256) as sb:
        print(sb.commands.run("uname -a").stdout)
"""

from . import _types as types
from ._errors import (
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
    UnavailableError,
)
from .client import AsyncSpace, Space
from .commands import AsyncCommandHandle, CommandHandle, CommandResult
from .pty import AsyncPtyHandle, PtyHandle
from .sandbox import AsyncSandbox, Sandbox
from .templates import TemplateBuildError, tar_dir

__version__ = "0.1.0"

__all__ = [
    "Space", "AsyncSpace", "Sandbox", "AsyncSandbox", "CommandResult", "CommandHandle", "AsyncCommandHandle",
    "PtyHandle", "AsyncPtyHandle", "types", "tar_dir",
    "SpaceError", "InvalidArgumentError", "AuthenticationError", "PermissionDeniedError", "NotFoundError",
    "ConflictError", "FailedPreconditionError", "RequestTooLargeError", "QuotaExceededError", "UnavailableError",
    "DeadlineExceededError", "InternalError", "StreamCutError", "CommandExitError", "TemplateBuildError",
]

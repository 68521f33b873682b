"""Exit codes and the one-line error messages adapterctl prints.

Exit codes (documented in `adapterctl --help`):
  0    success
  1    the request failed: the server rejected it (NOT_FOUND, INVALID_ARGUMENT,
       ABORTED, ...) or a confirmation was declined
  2    usage error: bad flags, bad adapter name, unusable adapter directory
  3    a server could not be reached in time (UNAVAILABLE, DEADLINE_EXCEEDED)
  4    not allowed: missing or invalid token, or a reader token for a write
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import grpc

from loraserve.adapterctl import entry
from loraserve.common.errors import LoraserveError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_ALLOWED = 4
EXIT_INTERRUPTED = entry.EXIT_INTERRUPTED

_UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_NOT_ALLOWED_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


class CliError(Exception):
    """A failure adapterctl explains in one line; `exit_code` is what the process returns."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class UsageError(CliError):
    """The command line or the local input is wrong; `usage` is shown with the message."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message, EXIT_USAGE)
        self.usage = usage


class ServerError(CliError):
    """A call to one of the servers failed with a gRPC status."""

    def __init__(self, error: LoraserveError, server: str, address: str) -> None:
        self.error = error
        self.code = error.code
        message = f"{error.code.name}: {error.message}"
        if error.code is grpc.StatusCode.UNAVAILABLE:
            message = f"{error.code.name}: cannot reach the {server} at {address}: {error.message}"
        elif error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            message = f"{error.code.name}: no answer from the {server} at {address} in time"
        super().__init__(message, exit_code_for_status(error.code))


def exit_code_for_status(code: grpc.StatusCode) -> int:
    if code in _UNREACHABLE_CODES:
        return EXIT_UNREACHABLE
    if code in _NOT_ALLOWED_CODES:
        return EXIT_NOT_ALLOWED
    return EXIT_FAILED

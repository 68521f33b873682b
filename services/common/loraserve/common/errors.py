"""Domain errors shared by both services, and their one mapping to gRPC status codes.

Library code raises these; only `loraserve.common.rpc.grpcutil` turns them into gRPC
statuses, for unary and streaming calls alike. Anything else that escapes a
servicer is a bug and becomes INTERNAL.
"""

from __future__ import annotations

import grpc


class LoraserveError(Exception):
    """Base of every expected error; `code` is the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(LoraserveError):
    """The request is malformed: a bad name, parameter or file."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(LoraserveError):
    """The adapter or revision does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(LoraserveError):
    """The request is well formed but cannot apply to the current state,
    e.g. an adapter incompatible with the served model."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(LoraserveError):
    """A concurrency check failed (compare-and-set lost); retry after re-reading."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(LoraserveError):
    """A position lies outside what is kept, e.g. a watch behind the kept log."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unavailable(LoraserveError):
    """A transient condition; the caller may retry with backoff."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(LoraserveError):
    """A bounded resource (admission queue, size limit) is full."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class QuotaExceeded(ResourceExhausted):
    """An adapter's quota refuses the request now; it may be admitted after
    `retry_after_s` (gRPC trailing metadata `retry-after`, HTTP's Retry-After)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DataLoss(LoraserveError):
    """Stored data is corrupt, e.g. a blob whose SHA-256 does not match."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(LoraserveError):
    """No valid credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(LoraserveError):
    """Valid credentials without the needed role."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Cancelled(LoraserveError):
    """The call was cancelled by the caller."""

    code = grpc.StatusCode.CANCELLED


class DeadlineExceeded(LoraserveError):
    """The call's deadline passed."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(LoraserveError):
    """The server does not offer this call (an older version, or switched off)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(LoraserveError):
    """A bug on the server side."""

    code = grpc.StatusCode.INTERNAL


# Worth retrying: the condition may pass. Everything else is final for the request.
TRANSIENT_ERRORS: tuple[type[LoraserveError], ...] = (
    Unavailable,
    DeadlineExceeded,
    Cancelled,
    ResourceExhausted,
    Aborted,
)

_BY_CODE: dict[grpc.StatusCode, type[LoraserveError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unavailable,
        ResourceExhausted,
        DataLoss,
        Unauthenticated,
        PermissionDenied,
        Cancelled,
        DeadlineExceeded,
        Unimplemented,
        Internal,
    )
}


def error_from_rpc(error: grpc.aio.AioRpcError | grpc.RpcError) -> LoraserveError:
    """Turns a failed call's status back into the domain error it stands for,
    so clients of either service handle one family of exceptions."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or str(code)
    return _BY_CODE.get(code, Internal)(details)


def rpc_code(error: BaseException) -> int:
    """The google.rpc code number to report for an error (13 INTERNAL for bugs)."""
    code = error.code if isinstance(error, LoraserveError) else grpc.StatusCode.INTERNAL
    number: int = code.value[0]
    return number

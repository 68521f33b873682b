"""The retries stamina schedules, logged with what is retried, the attempt, the wait
and the error, and named so that log line says what it is about.

stamina's own logging hook passes its details as `extra` fields, which a plain
`logging` formatter drops: the servers' logs read `stamina.retry_scheduled` and
nothing else. `install` replaces it with `log_retry` (stamina's Prometheus counter
stays); `retry_context` is `stamina.retry_context` under a name of the caller's,
where stamina itself would only say `<context block>`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import stamina
from stamina.instrumentation import (
    PrometheusOnRetryHook,
    RetryDetails,
    RetryHook,
    RetryHookFactory,
    set_on_retry_hooks,
)

from loraserve.common.errors import LoraserveError

log = logging.getLogger(__name__)

# An error's description in the log line is cut here: a retried error's text can be
# a whole server reply.
MAX_ERROR_CHARS = 500


def describe_error(error: BaseException) -> str:
    """One line naming the error: its gRPC status and message where it has one."""
    if isinstance(error, LoraserveError):
        text = f"{error.code.name}: {error.message}"
    elif isinstance(error, grpc.aio.AioRpcError):
        text = f"{error.code().name}: {error.details()}"
    else:
        text = f"{type(error).__name__}: {error}"
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def log_retry(details: RetryDetails) -> None:
    """stamina's retry hook: one line per scheduled retry."""
    log.warning(
        "stamina.retry_scheduled what=%s attempt=%d wait_s=%.2f waited_s=%.2f error=%s",
        details.name,
        details.retry_num,
        details.wait_for,
        details.waited_so_far,
        describe_error(details.caused_by),
    )


def install(*, prometheus: bool = True) -> None:
    """Makes `log_retry` stamina's logging hook for this process (a server's
    `__main__` calls it once); with `prometheus`, stamina's retry counter stays."""
    hooks: list[RetryHook | RetryHookFactory] = [log_retry]
    if prometheus:
        hooks.insert(0, PrometheusOnRetryHook)
    set_on_retry_hooks(hooks)


def retry_context(what: str, **kwargs: Any) -> AsyncIterator[stamina.Attempt]:
    """`stamina.retry_context(**kwargs)` whose retries are logged as `what`."""
    attempts: AsyncIterator[stamina.Attempt] = stamina.retry_context(**kwargs).with_name(
        what, (), {}
    )
    return attempts

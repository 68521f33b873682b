"""Generate's span on every front: `loraserve.generate`, a SERVER span in the caller's
trace (the W3C context its gRPC metadata or HTTP headers carried; a trace of its own when
none). It names the adapter and revision that served the request, the rollout arm, the
waits before the engine (the fair gate's turn; the adapter's lease, which is its load
on a miss), whether it was admitted, the engine's time to first token (prefill), the
tokens and the finish; with `principals`, the caller's principal (`enduser.id`). The
first request a newly published revision serves links to the trace that published it
(adapters.published): it is its own request, not a child of the push.

The span is current while the request waits for its turn and its lease, so that a load
on a miss is traced under it, and for the request's log lines, but never across a
yield: a stream's consumer may read it from another task. The engine gets its context
as headers (vLLM's `trace_headers`), so that vLLM's own spans, where its tracing is on,
join under it.

Off (no endpoint) a request reads no trace context and starts no span; where a request
is not sampled, it pays for OpenTelemetry's non-recording span and no more. `UNTRACED`
stands in for the span and does nothing (bench/micro/tracing_off.py measures what is
left per request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import Generic, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from loraserve.clients.store import RolloutSplit
from loraserve.common.revisions.names import AdapterRef
from loraserve.common.rpc.security import current_principal, current_role
from loraserve.common.tracing import TracingSettings, context_from, link_to, tracer
from loraserve.inference.adapters import Lease
from loraserve.inference.serving.chunks import FinishReason, Outcome

T = TypeVar("T")

SPAN_NAME = "loraserve.generate"
_TRACER = tracer(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()
# The codes that are the server's fault (OpenTelemetry's rule for gRPC server spans):
# only they set the span's status to ERROR; the caller's mistakes are recorded, not failed.
_SERVER_FAULTS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)
_UNTRACED_BLOCK = nullcontext()

# The registry's `split_of`: an adapter's active rollout, if any.
SplitOf = Callable[[str], RolloutSplit | None]


@dataclass(slots=True)
class TraceOrigin:
    """Where a Generate came in: its caller's gRPC metadata or HTTP headers (lowercase
    keys), read for a trace context only where tracing is on, and what its front says
    of the call (OpenTelemetry's rpc.* or http.* attributes)."""

    metadata: Iterable[tuple[str, str | bytes]]
    attributes: Mapping[str, AttributeValue]


class GenerateSpans:
    """Starts each request's span. Off without an endpoint (`settings`): no provider
    could record a span, so a request reads no trace context and starts no span at all.
    Names callers' principals only with `principals` (`--trace-principals`: who calls is
    not every trace backend's business)."""

    def __init__(self, settings: TracingSettings | None = None) -> None:
        settings = settings or TracingSettings()
        self._on = settings.endpoint is not None
        self._principals = settings.principals

    def start(self, origin: TraceOrigin | None, adapter: str, request_id: str) -> RequestTrace:
        if not self._on:
            return UNTRACED
        span = _TRACER.start_span(
            SPAN_NAME,
            context_from(origin.metadata) if origin is not None else None,
            SpanKind.SERVER,
            origin.attributes if origin is not None else None,
        )
        if not span.is_recording():
            return UNTRACED
        span.set_attributes({"loraserve.adapter": adapter, "loraserve.request_id": request_id})
        if self._principals and current_role.get() is not None:
            span.set_attribute("enduser.id", current_principal.get())
        return RequestTrace(span)


class RequestTrace:
    """One request's recording span and the times it records."""

    __slots__ = ("_span", "_start", "_start_ns", "_waits")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._start = time.monotonic()
        self._start_ns = time.time_ns()
        self._waits: dict[str, float] = {}

    def current(self) -> AbstractContextManager[object]:
        """Makes the span current for a block that yields nothing to the consumer."""
        return trace.use_span(self._span, record_exception=False, set_status_on_exception=False)

    def waiting(
        self, what: str, entered: AbstractAsyncContextManager[T]
    ) -> AbstractAsyncContextManager[T]:
        """`entered`, entered with the span current and the wait recorded as
        `loraserve.wait.<what>_s`."""
        return _Waited(self, what, entered)

    def waited(self, what: str, since: float) -> None:
        self._waits[what] = time.monotonic() - since

    def leased(self, lease: Lease, ref: AdapterRef, split_of: SplitOf, prompt_tokens: int) -> None:
        """The revision that serves the request, its arm, its prompt, and the link to the
        trace that published the revision when this is its first request."""
        span = self._span
        span.set_attributes(
            {
                "loraserve.adapter": lease.name,
                "loraserve.revision": lease.revision,
                "loraserve.rollout.arm": _arm(lease, ref, split_of),
                "gen_ai.usage.input_tokens": prompt_tokens,
            }
        )
        for link in link_to(lease.published_by):
            span.add_link(link.context, {"loraserve.link": "published"})

    def engine_headers(self) -> dict[str, str] | None:
        """The span's context as the engine takes it (W3C headers)."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(self._span))
        return carrier

    def finished(self, finish: FinishReason) -> None:
        self._span.set_attribute("gen_ai.response.finish_reasons", (finish.value,))

    def end(self, code: str, outcome: Outcome, error: BaseException | None) -> None:
        """Ends the span with what the request came to; `code` is its gRPC code's name."""
        span = self._span
        attributes: dict[str, AttributeValue] = {
            "loraserve.code": code,
            "loraserve.admitted": bool(outcome.admitted),
            "gen_ai.usage.output_tokens": outcome.generated,
        }
        for what, seconds in self._waits.items():
            attributes[f"loraserve.wait.{what}_s"] = seconds
        if outcome.submitted:
            attributes["loraserve.wait.queue_s"] = outcome.submitted - self._start
            span.add_event("submitted", timestamp=self._wall_ns(outcome.submitted))
        if outcome.first_token is not None:
            attributes["loraserve.ttft_s"] = outcome.first_token - self._start
            attributes["loraserve.prefill_s"] = outcome.first_token - outcome.submitted
            span.add_event("first_token", timestamp=self._wall_ns(outcome.first_token))
        span.set_attributes(attributes)
        if error is not None and code != "CANCELLED":
            span.record_exception(error)
            if code in _SERVER_FAULTS:
                span.set_status(Status(StatusCode.ERROR, f"{code}: {error}"))
        span.end()

    def _wall_ns(self, monotonic: float) -> int:
        return self._start_ns + int((monotonic - self._start) * 1e9)


class _Untraced(RequestTrace):
    """Stands in for the span of a request that is not recorded: does nothing."""

    __slots__ = ()

    def current(self) -> AbstractContextManager[object]:
        return _UNTRACED_BLOCK

    def waiting(
        self, what: str, entered: AbstractAsyncContextManager[T]
    ) -> AbstractAsyncContextManager[T]:
        return entered

    def leased(self, lease: Lease, ref: AdapterRef, split_of: SplitOf, prompt_tokens: int) -> None:
        pass

    def engine_headers(self) -> dict[str, str] | None:
        return None

    def finished(self, finish: FinishReason) -> None:
        pass

    def end(self, code: str, outcome: Outcome, error: BaseException | None) -> None:
        pass


UNTRACED: RequestTrace = _Untraced(trace.INVALID_SPAN)


class _Waited(Generic[T]):
    """An async context manager entered with a request's span current, timed."""

    __slots__ = ("_entered", "_trace", "_what")

    def __init__(
        self, trace_: RequestTrace, what: str, entered: AbstractAsyncContextManager[T]
    ) -> None:
        self._trace = trace_
        self._what = what
        self._entered = entered

    async def __aenter__(self) -> T:
        since = time.monotonic()
        with self._trace.current():
            value = await self._entered.__aenter__()
        self._trace.waited(self._what, since)
        return value

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        return await self._entered.__aexit__(kind, error, traceback)


def _arm(lease: Lease, ref: AdapterRef, split_of: SplitOf) -> str:
    """Which arm served: a pin (`NAME@REV`), a rollout's candidate, or the current one."""
    if ref.is_base:
        return "base"
    if ref.revision is not None:
        return "pinned"
    split = split_of(lease.name)
    if split is not None and split.candidate.revision == lease.revision:
        return "candidate"
    return "current"

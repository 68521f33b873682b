"""Where one push's time goes, read from its trace (issue 55's profile): the store and
the replica export their spans to an OTLP receiver in the benchmark process, and each
push's trace is found by the store's server span of it (`loraserve.store.push`, named
for the adapter and revision). adapterctl runs untraced, as a user runs it (tracing it
would import the OpenTelemetry SDK into every timed push), so its own work shows as the
time before the store's span starts.

Every span of the trace is placed against the push's start: when its first one of a
name started, how long all of them of that name took together, and how many there
were; the store's object storage requests are spans by kind
(`loraserve.store.s3.upload_part`, ...), so this counts S3 calls by kind too."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.method.report import Cell, Section
from bench.method.stats import median
from loraserve.testing.otlp import OtlpReceiver, ReceivedSpan

STORE_PUSH = "loraserve.store.push"
# The replica's span that ends its part of a push: the new revision routed.
LAST = "loraserve.replica.route"
# Seconds to wait for the batched exporters to deliver every push's spans, all together.
ARRIVAL_S = 30.0
_NANO = 1e-9


@dataclass(frozen=True)
class SpanTimes:
    """One span name within one push: seconds from the push's start to the first
    span's start, their seconds summed, how many."""

    start_s: float
    total_s: float
    count: int


def _pushed_by(span: ReceivedSpan, name: str, revision: int) -> bool:
    attributes = span.attributes
    return (
        span.name == STORE_PUSH
        and attributes.get("loraserve.adapter") == name
        and attributes.get("loraserve.revision") == revision
    )


async def push_profile(
    receiver: OtlpReceiver, name: str, revision: int, started_unix_s: float, deadline: float
) -> dict[str, SpanTimes]:
    """The push of `name` at `revision`, started at wall time `started_unix_s`, span
    name by span name; {} when its spans did not arrive by `deadline` (loop time)."""
    loop = asyncio.get_running_loop()
    while True:
        pushed = [s for s in receiver.spans(STORE_PUSH) if _pushed_by(s, name, revision)]
        if pushed:
            trace = pushed[0].trace_id
            spans = [s for s in receiver.spans() if s.trace_id == trace]
            if any(s.name == LAST for s in spans):
                return span_times(spans, started_unix_s)
        if loop.time() > deadline:
            return {}
        await asyncio.sleep(0.2)


def span_times(spans: Sequence[ReceivedSpan], started_unix_s: float) -> dict[str, SpanTimes]:
    """Each name's spans against the push's start at wall time `started_unix_s`."""
    by_name: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    times: dict[str, SpanTimes] = {}
    for name, mine in by_name.items():
        first = min(s.span.start_time_unix_nano for s in mine) * _NANO
        total = sum(s.span.end_time_unix_nano - s.span.start_time_unix_nano for s in mine)
        times[name] = SpanTimes(first - started_unix_s, total * _NANO, len(mine))
    return times


def profile_table(section: Section, profiles: Sequence[Mapping[str, SpanTimes]]) -> None:
    """Medians over the pushes traced, in the order the spans started."""
    traced = [p for p in profiles if p]
    if not traced:
        return
    names = sorted({n for p in traced for n in p})
    rows: list[tuple[float, list[Cell]]] = []
    for name in names:
        seen = [p[name] for p in traced if name in p]
        start = median([t.start_s for t in seen]) * 1000
        total = median([t.total_s for t in seen]) * 1000
        count = median([float(t.count) for t in seen])
        rows.append((start, [name, start, total, count, f"{len(seen)}/{len(traced)}"]))
    rows.sort(key=lambda row: row[0])
    section.table(
        "loraserve's push, span by span from its trace (medians; ms after the push started; "
        "a name's spans summed)",
        ["span", "starts at", "takes", "per push", "pushes with it"],
        [row for _, row in rows],
    )

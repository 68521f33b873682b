"""The gauges of the Gateway API Inference Extension's model-server protocol.

An endpoint picker (the inference extension's, llm-d's) scrapes these from every
replica to route HTTP requests: `vllm:num_requests_waiting`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc` (a fraction, as vLLM's) and,
for LoRA affinity, `vllm:lora_requests_info`. The picker reads that last one from its
labels only: `running_lora_adapters` and `waiting_lora_adapters` are comma-separated
adapter names, `max_lora` the adapters one batch can hold; of several series it takes
the one with the largest value, which vLLM sets to the time of the report.

Unlike vLLM's own gauge, which renders both lists from the adapters with any request,
an adapter is listed as running while it has running requests, and as waiting while it
has waiting ones and none running: the picker's LoRA-affinity scorer counts both lists
against `max_lora` as slots taken, and an adapter running takes one slot however many
of its requests wait. Names are those clients put in `model` (without the engine's
`@REVISION`). Every scrape reads the engine once and renders exactly one series, so no
stale label set lingers.

Beside them, `loraserve_inference_adapter_resident{adapter}` names the adapters in the
engine, for a picker that routes on what is loaded rather than on what ran recently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from loraserve.inference.engine import EngineStats

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
LORA_REQUESTS_INFO = "vllm:lora_requests_info"
RESIDENT = "loraserve_inference_adapter_resident"
LORA_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")


class ModelServerProtocolCollector:
    """A prometheus_client collector reading `stats` at every scrape."""

    def __init__(
        self,
        stats: Callable[[], EngineStats],
        *,
        max_lora: int,
        resident: Callable[[], Iterable[str]] = tuple,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._stats = stats
        self._max_lora = max_lora
        self._resident = resident
        self._clock = clock

    def describe(self) -> Iterator[Metric]:
        # Names only: registering must not read an engine that may not be running.
        yield from _families(None, self._max_lora, 0.0)
        yield _residency(())

    def collect(self) -> Iterator[Metric]:
        yield from _families(self._stats(), self._max_lora, self._clock())
        yield _residency(self._resident())


def served_name(lora_name: str) -> str:
    """The adapter name clients use, from the engine's `NAME@REVISION`."""
    return lora_name.partition("@")[0]


def _families(stats: EngineStats | None, max_lora: int, now: float) -> Iterator[Metric]:
    waiting = GaugeMetricFamily(WAITING, "Requests waiting in the engine.")
    running = GaugeMetricFamily(RUNNING, "Requests the engine runs.")
    usage = GaugeMetricFamily(KV_CACHE_USAGE, "Fraction of the KV cache in use (1 = 100%).")
    lora = GaugeMetricFamily(
        LORA_REQUESTS_INFO,
        "Adapters with running and with waiting requests; the value is the time read.",
        labels=LORA_LABELS,
    )
    if stats is not None:
        waiting.add_metric([], stats.waiting)
        running.add_metric([], stats.running)
        usage.add_metric([], stats.kv_cache_usage)
        running_names = _names(stats.running_adapters)
        waiting_names = _names(stats.waiting_adapters) - running_names
        lora.add_metric([str(max_lora), _joined(running_names), _joined(waiting_names)], now)
    yield from (waiting, running, usage, lora)


def _residency(names: Iterable[str]) -> Metric:
    """One series per adapter whose current revision is in the engine: at most the
    engine's host-memory capacity (--max-cpu-loras) of them, so bounded."""
    family = GaugeMetricFamily(
        RESIDENT,
        "1 for each adapter whose current revision is in the engine (LoRA slots or host "
        "memory): a request of it starts without a load.",
        labels=["adapter"],
    )
    for name in names:
        family.add_metric([name], 1.0)
    return family


def _names(lora_names: Iterable[str]) -> set[str]:
    return {served_name(name) for name in lora_names}


def _joined(names: set[str]) -> str:
    return ",".join(sorted(names))

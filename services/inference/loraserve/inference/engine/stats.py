"""Listening to vLLM's scheduler stats for an engine that already exists.

vLLM reports scheduler stats only to its stat loggers (and only with log_stats
on); `SchedulerTap` is one, and keeps just the latest numbers. Until the first
report, `seen` is False and the numbers are zeros, not estimates.

vLLM counts requests per adapter (by its LoRA name) in two dicts that both list every
adapter with any request, running or waiting, with a zero count where it has none of
that kind; only adapters with a nonzero count are kept here, so the running set holds
adapters with running requests and the waiting set those with waiting ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SchedulerTap:
    """Keeps the latest scheduler stats vLLM reports (it reports them only with log_stats on)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    # vLLM LoRA names of adapters with running (waiting) requests.
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()
    seen: bool = field(default=False)

    def record(self, scheduler_stats: Any, iteration_stats: Any, **_: Any) -> None:
        if scheduler_stats is None:
            return
        self.running = scheduler_stats.num_running_reqs
        self.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
        self.kv_cache_usage = scheduler_stats.kv_cache_usage
        self.running_adapters = _with_requests(scheduler_stats.running_lora_adapters)
        self.waiting_adapters = _with_requests(scheduler_stats.waiting_lora_adapters)
        self.seen = True

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def record_sleep_state(self, *_: Any, **__: Any) -> None:
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass


def _with_requests(counts: dict[str, int]) -> frozenset[str]:
    return frozenset(name for name, count in counts.items() if count > 0)

"""Prometheus metrics of one inference server, in a registry of its own.

A registry per server (not prometheus_client's global one) lets several servers live
in one process, as they do in tests. Gauges of engine state are read at scrape time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loraserve.inference.adapters import TierCounters, TierUsage
from loraserve.inference.engine import EngineStats
from loraserve.inference.metrics.model_server import ModelServerProtocolCollector
from loraserve.inference.metrics.rollout_metrics import RolloutMeter

log = logging.getLogger(__name__)

BASE_MODEL_LABEL = "_base"

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class InferenceMetrics:
    """The metrics DESIGN.md names, with hooks for the parts that produce them."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._add_request_metrics(r)
        self._add_adapter_metrics(r)
        self._add_download_metrics(r)
        self._add_engine_metrics(r)

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        """Per request: status, tokens, time to first token."""
        self._requests = Counter(
            "loraserve_inference_requests",
            "Generate calls by adapter and gRPC status code.",
            ["adapter", "code"],
            registry=r,
        )
        self._throttled = Counter(
            "loraserve_inference_throttled_requests",
            "Requests refused by their adapter's quota on this replica, by adapter and the "
            "limit reached (in_flight, tokens_per_second, tokens_per_minute).",
            ["adapter", "limit"],
            registry=r,
        )
        self._prompt_tokens = Counter(
            "loraserve_inference_prompt_tokens",
            "Prompt tokens of Generate calls, by adapter.",
            ["adapter"],
            registry=r,
        )
        self._generated_tokens = Counter(
            "loraserve_inference_generated_tokens",
            "Tokens generated, by adapter.",
            ["adapter"],
            registry=r,
        )
        self._ttft = Histogram(
            "loraserve_inference_time_to_first_token_seconds",
            "From admission to the first generated token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def _add_adapter_metrics(self, r: CollectorRegistry) -> None:
        """Per adapter revision: swaps, loads and the tiers that hold them."""
        self._swap = Histogram(
            "loraserve_inference_adapter_swap_seconds",
            "From a new revision's event seen to its route flipped.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._load_failures = Counter(
            "loraserve_inference_adapter_load_failures",
            "Adapter revisions that could not be loaded, by adapter.",
            ["adapter"],
            registry=r,
        )
        self.tier_counters = TierCounters()
        # Per revision, the adapters in a rollout (both arms).
        self.rollouts = RolloutMeter(r)
        self._misses = Counter(
            "loraserve_inference_adapter_misses",
            "Requests whose adapter was not in the tier (engine: not loaded, the request "
            "waited for the load; disk: the load had to download it).",
            ["tier"],
            registry=r,
        )
        self._evictions = Counter(
            "loraserve_inference_adapter_evictions",
            "Revisions evicted from the tier (engine: removed to free disk; disk: files "
            "deleted to stay under --adapter-cache-size).",
            ["tier"],
            registry=r,
        )
        self._load_wait = Histogram(
            "loraserve_inference_adapter_load_seconds",
            "Time a request waited for its adapter to load on miss, by where it came from.",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._tier_adapters = Gauge(
            "loraserve_inference_adapter_tier_adapters",
            "Adapter revisions in each tier (slot: running requests; host: in the engine's "
            "host memory; engine: loaded; disk: in the disk cache; routed: adapter names "
            "this replica routes, loaded or not).",
            ["tier"],
            registry=r,
        )
        self._cache_bytes = Gauge(
            "loraserve_inference_adapter_cache_bytes", "Bytes in the disk cache.", registry=r
        )
        self._cache_capacity = Gauge(
            "loraserve_inference_adapter_cache_capacity_bytes",
            "The disk cache's bound (--adapter-cache-size); 0 when unbounded.",
            registry=r,
        )

    def _add_download_metrics(self, r: CollectorRegistry) -> None:
        """How the disk cache got its revisions."""
        self._downloads = Counter(
            "loraserve_inference_adapter_downloads",
            "Adapter revisions downloaded into the disk cache, by path (direct: from object "
            "storage with the store's presigned URLs; stream: through the store).",
            ["path"],
            registry=r,
        )
        for path in ("direct", "stream"):
            # Both exported from the start, at 0: a sum over them is never missing.
            self._downloads.labels(path)

    def _add_engine_metrics(self, r: CollectorRegistry) -> None:
        """What the engine runs and holds now."""
        self._lora_slots = Gauge(
            "loraserve_inference_lora_slots", "Adapters the engine batches at once.", registry=r
        )
        self._loaded = Gauge(
            "loraserve_inference_loaded_adapters",
            "Adapter revisions loaded in the engine.",
            registry=r,
        )
        self._kv_usage = Gauge(
            "loraserve_inference_kv_cache_usage", "Fraction of the KV cache in use.", registry=r
        )
        self._running = Gauge(
            "loraserve_inference_running_requests", "Requests the engine runs.", registry=r
        )
        self._waiting = Gauge(
            "loraserve_inference_waiting_requests", "Requests waiting in the engine.", registry=r
        )
        self._pending = Gauge(
            "loraserve_inference_pending_requests",
            "Sequences admitted and not finished (a request counts its n).",
            registry=r,
        )

    # -- hooks for producers ----------------------------------------------------------

    def request_finished(self, adapter: str, code: str) -> None:
        self._requests.labels(_label(adapter), code).inc()

    def request_throttled(self, adapter: str, limit: str) -> None:
        self._throttled.labels(_label(adapter), limit).inc()

    def tokens(self, adapter: str, *, prompt: int, generated: int) -> None:
        self._prompt_tokens.labels(_label(adapter)).inc(prompt)
        self._generated_tokens.labels(_label(adapter)).inc(generated)

    def revision_finished(
        self,
        adapter: str,
        revision: int,
        code: str,
        ttft_s: float | None,
        generated: int,
        *,
        caller: str = "",
        split: bool = True,
    ) -> None:
        """A request served by `revision`: counted per arm while `adapter` is in a rollout
        and its split chose the arm (see RolloutMeter.finished)."""
        self.rollouts.finished(adapter, revision, code, ttft_s, generated, caller, split=split)

    def rollout_set(self, name: str, candidate: int) -> None:
        self.rollouts.set(name, candidate)

    def rollout_ended(self, name: str) -> None:
        self.rollouts.end(name)

    def observe_time_to_first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def observe_swap_latency(self, seconds: float) -> None:
        """Called by the sync side when a revision whose event it saw is routed."""
        self._swap.observe(seconds)

    def adapter_load_failed(self, name: str) -> None:
        self._load_failures.labels(_label(name)).inc()

    def adapter_downloaded(self, path: str) -> None:
        self._downloads.labels(path).inc()

    def adapter_missed(self, tier: str) -> None:
        self._misses.labels(tier).inc()
        if tier == "engine":
            self.tier_counters.engine_misses += 1
        else:
            self.tier_counters.disk_misses += 1

    def adapter_evicted(self, tier: str) -> None:
        self._evictions.labels(tier).inc()
        if tier == "engine":
            self.tier_counters.engine_evictions += 1
        else:
            self.tier_counters.disk_evictions += 1

    def adapter_load_waited(self, source: str, seconds: float) -> None:
        self._load_wait.labels(source).observe(seconds)
        self.tier_counters.recent_waits.append(seconds)

    def watch_tiers(self, usage: Callable[[], TierUsage]) -> None:
        """Reads the tiers' occupancy at scrape time."""
        gauges = {
            "slot": lambda: usage().slots_in_use,
            "host": lambda: usage().host_adapters,
            "engine": lambda: usage().engine_adapters,
            "disk": lambda: usage().disk.revisions,
            "routed": lambda: usage().routed_adapters,
        }
        for tier, read in gauges.items():
            self._tier_adapters.labels(tier).set_function(read)
        self._cache_bytes.set_function(lambda: usage().disk.bytes)
        self._cache_capacity.set_function(lambda: usage().disk.capacity_bytes or 0)

    def watch_engine(
        self,
        *,
        lora_slots: int,
        loaded: Callable[[], int],
        kv_usage: Callable[[], float],
        running: Callable[[], int],
        waiting: Callable[[], int],
        pending: Callable[[], int],
    ) -> None:
        """Reads engine state at scrape time from these callables."""
        self._lora_slots.set(lora_slots)
        self._loaded.set_function(loaded)
        self._kv_usage.set_function(kv_usage)
        self._running.set_function(running)
        self._waiting.set_function(waiting)
        self._pending.set_function(pending)

    def export_model_server_protocol(
        self, stats: Callable[[], EngineStats], *, max_lora: int
    ) -> None:
        """Adds the gauges an inference-extension endpoint picker routes on (msp_metrics)."""
        self.registry.register(ModelServerProtocolCollector(stats, max_lora=max_lora))


def _label(adapter: str) -> str:
    return adapter or BASE_MODEL_LABEL

"""Prometheus metrics of one inference server, in a registry of its own.

A registry per server (not prometheus_client's global one) lets several servers live
in one process, as they do in tests. Gauges of engine state are read at scrape time.
Per-adapter counters name the top K adapters by traffic and fold the rest into
`_other` (adapter_series). deploy/grafana/loraserve.json charts these.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loraserve.common.release import add_build_info
from loraserve.inference.adapters import TierCounters, TierUsage
from loraserve.inference.engine import EngineStats
from loraserve.inference.metrics.adapter_series import TopAdapters
from loraserve.inference.metrics.model_server import ModelServerProtocolCollector
from loraserve.inference.metrics.rollout_metrics import RolloutMeter

log = logging.getLogger(__name__)

BASE_MODEL_LABEL = "_base"

# As --metrics-top-adapters' default (settings, which this layer does not import).
DEFAULT_TOP_ADAPTERS = 50

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Most requests wait for nothing: the first bound tells "went straight in" apart.
_WAIT_BUCKETS = (0.001, *_LATENCY_BUCKETS)
# A decode step of a small batch takes milliseconds, of a large one on CPU a second.
_INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)


class InferenceMetrics:
    """The metrics DESIGN.md names, with hooks for the parts that produce them."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        top_adapters: int = DEFAULT_TOP_ADAPTERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        add_build_info(r)
        # Which adapters the per-adapter counters name (`--metrics-top-adapters`), re-ranked
        # on `clock`.
        self._adapters = TopAdapters(top_adapters, clock=clock)
        self._add_request_metrics(r)
        self._add_wait_metrics(r)
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
        self._adapters.track(self._requests, ["adapter", "code"])
        self._adapters.track(self._throttled, ["adapter", "limit"])
        self._adapters.track(self._prompt_tokens, ["adapter"])
        self._adapters.track(self._generated_tokens, ["adapter"])

    def _add_wait_metrics(self, r: CollectorRegistry) -> None:
        """Where an admitted request's time goes before and between its tokens."""
        self._gate_wait = Histogram(
            "loraserve_inference_gate_wait_seconds",
            "Time an admitted request waited for its fair turn into the engine and for its "
            "adapter's LoRA slot (requests that got both; none with --admission-order fifo "
            "and --lora-slot-order engine).",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self._queue_wait = Histogram(
            "loraserve_inference_queue_wait_seconds",
            "From admission to the engine's submission: the prompt's rendering, the fair "
            "turn and the adapter's lease (its load on a miss).",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self._inter_token = Histogram(
            "loraserve_inference_inter_token_latency_seconds",
            "Mean time between a finished request's tokens after its first (per sequence "
            "when n > 1): vLLM's time per output token, observed once per request.",
            buckets=_INTER_TOKEN_BUCKETS,
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
        self._adapters.track(self._load_failures, ["adapter"])
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

    @property
    def top_adapters(self) -> int:
        """The most adapters the per-adapter counters name (others count as `_other`)."""
        return self._adapters.top

    # -- hooks for producers ----------------------------------------------------------

    def request_finished(self, adapter: str, code: str) -> None:
        name = adapter or BASE_MODEL_LABEL
        # Ranked first: the request that makes a re-rank due is counted under the new rank.
        self._adapters.finished(name)
        self._requests.labels(self._adapters.label(name), code).inc()

    def request_throttled(self, adapter: str, limit: str) -> None:
        self._throttled.labels(self._label(adapter), limit).inc()

    def tokens(self, adapter: str, *, prompt: int, generated: int) -> None:
        label = self._label(adapter)
        self._prompt_tokens.labels(label).inc(prompt)
        self._generated_tokens.labels(label).inc(generated)

    def observe_gate_wait(self, seconds: float) -> None:
        self._gate_wait.observe(seconds)

    def observe_queue_wait(self, seconds: float) -> None:
        self._queue_wait.observe(seconds)

    def observe_inter_token_latency(
        self, first_token: float | None, generated: int, sequences: int
    ) -> None:
        """At a finished request's end: `first_token` its first token's time.monotonic(),
        `generated` its tokens over all its `sequences` (its n)."""
        per_sequence = generated / max(sequences, 1)
        if first_token is not None and per_sequence > 1:
            self._inter_token.observe((time.monotonic() - first_token) / (per_sequence - 1))

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
        self._load_failures.labels(self._label(name)).inc()

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
        self,
        stats: Callable[[], EngineStats],
        *,
        max_lora: int,
        resident: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        """Adds the gauges an inference-extension endpoint picker routes on (msp_metrics),
        and which adapters are in the engine (`resident`)."""
        self.registry.register(
            ModelServerProtocolCollector(stats, max_lora=max_lora, resident=resident)
        )

    def _label(self, adapter: str) -> str:
        return self._adapters.label(adapter or BASE_MODEL_LABEL)

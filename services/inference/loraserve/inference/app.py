"""Assembles and runs one inference server: gRPC first, then engine, then sync.

Start-up order matters for load balancers: the gRPC server listens at once and
answers health checks with NOT_SERVING, calls get UNAVAILABLE while the engine
loads, and health turns SERVING only when the engine is warm and the first sync
with the store is done. Shutdown reverses it: NOT_SERVING, running streams get the
grace period, sync stops, the engine shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import stamina

from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.errors import TRANSIENT_ERRORS, LoraserveError
from loraserve.common.revisions.manifest import Revision
from loraserve.common.rpc import retrylog
from loraserve.common.rpc.metrics_http import serve_metrics
from loraserve.common.trust.policy import RevisionTrust
from loraserve.inference.adapters import (
    AdapterRegistry,
    CompatibilityChecker,
    TierView,
    model_lora_shapes,
    model_lora_targets,
    smallest_covering_rank,
    supported_lora_ranks,
)
from loraserve.inference.cache import AdapterCache, FetchSettings, ReadSettings
from loraserve.inference.engine import VllmEngine, pushed_outputs_supported
from loraserve.inference.metrics import TTFT_BOUNDS_S, InferenceMetrics
from loraserve.inference.serving import (
    Admission,
    Generator,
    QuotaGate,
    Runtime,
    RuntimeRef,
    SlotGate,
    fair_gate,
)
from loraserve.inference.settings import EngineOptions, InferenceSettings
from loraserve.inference.sync import (
    ReportSettings,
    Synchronizer,
    SyncSettings,
    current_adapter_ranks,
)
from loraserve.inference.transport import GrpcFront, start_grpc_front

if TYPE_CHECKING:
    from loraserve.inference.openai import RunningHttpServer

log = logging.getLogger(__name__)

EngineStarter = Callable[[EngineOptions], Awaitable[VllmEngine]]

# First and longest wait between attempts to reach a store that is not up yet.
_STORE_WAIT_FIRST_S = 0.5
_STORE_WAIT_MAX_S = 10.0
# How fresh the host-memory tier's count is between GetServerInfo calls (metrics).
_HOST_TIER_REFRESH_S = 5.0


class InferenceApp:
    """One inference server's parts and their life cycle."""

    def __init__(
        self, settings: InferenceSettings, start_engine: EngineStarter = VllmEngine.start
    ) -> None:
        self._settings = settings
        self._start_engine = start_engine
        self.metrics = InferenceMetrics(top_adapters=settings.metrics_top_adapters)
        # The store's quotas: sync sets them, generation enforces them.
        self.quotas = QuotaGate(observer=self.metrics)
        self.runtime_ref = RuntimeRef(trust_rollout_key_header=settings.trust_rollout_key_header)
        self.ready = asyncio.Event()
        self._server: GrpcFront | None = None
        self._http: RunningHttpServer | None = None
        self._store: StoreClient | None = None
        self._engine: VllmEngine | None = None
        self._sync_task: asyncio.Task[None] | None = None
        self._background: list[asyncio.Task[None]] = []
        self._cache: AdapterCache | None = None
        self.metrics_port: int | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return self._server.port

    @property
    def grpc_front(self) -> GrpcFront:
        """The gRPC server: what serves Generate (`.transport`), and whether it failed."""
        if self._server is None:
            raise RuntimeError("the server is not started")
        return self._server

    @property
    def openai_port(self) -> int | None:
        """The OpenAI-compatible HTTP front's port; None when it is off."""
        return self._http.port if self._http is not None else None

    async def start(self) -> None:
        """Starts listening (NOT_SERVING); `run_engine_and_sync` does the rest."""
        settings = self._settings
        if settings.metrics_listen is not None:
            self.metrics_port = serve_metrics(self.metrics.registry, settings.metrics_listen)
        server = self._server = await start_grpc_front(settings, self.runtime_ref)
        try:
            if settings.openai_listen is not None:
                # Imported only when enabled: the HTTP stack is an optional part.
                from loraserve.inference.openai import start_openai_front

                self._http = await start_openai_front(
                    settings,
                    settings.openai_listen,
                    self.runtime_ref,
                    self.ready.is_set,
                    self.metrics.registry,
                )
            self._store = StoreClient.connect(
                StoreClientSettings(
                    address=settings.store_address,
                    security=settings.store_security,
                    replica_id=settings.replica_id,
                    max_staleness_s=settings.store_max_staleness_s,
                )
            )
        except BaseException:
            # Nothing left listening; what failed is what is raised.
            self._server = None
            for running in (server, self._http):
                if running is not None:
                    with contextlib.suppress(Exception):
                        await running.stop(None)
            self._http = None
            raise

    async def run_engine_and_sync(self) -> None:
        """Starts the engine, syncs with the store, turns SERVING; returns while sync runs."""
        assert self._server is not None
        assert self._store is not None
        settings = self._settings
        options = settings.engine
        if options.max_lora_rank is None:
            options = dataclasses.replace(options, max_lora_rank=await self._auto_rank())
        engine = self._engine = await self._start_engine(options)
        info = engine.info
        compat = await self._compatibility(options.model, info.max_lora_rank)
        trust = RevisionTrust(settings.trust)

        def servable(manifest: Revision) -> None:
            # Its signature first: nothing of an untrusted revision is looked at further.
            trust.check_revision(manifest)
            compat.check_manifest(manifest)

        cache = self._cache = await self._open_cache(servable)
        # Names whose report to the store may have changed: the registry adds, sync reads.
        changed: set[str] = set()
        registry = AdapterRegistry(
            engine,
            cache,
            compat,
            pins=dataclasses.replace(settings.pins, max_pinned=info.max_cpu_loras),
            observer=self.metrics,
            on_change=changed.add,
            verify=trust.check_revision,
        )
        synchronizer = Synchronizer(
            self._store,
            registry,
            cache,
            _sync_settings(settings),
            observe_swap=self.metrics.observe_swap_latency,
            changed=changed,
            counters=self.metrics.rollouts,
            ttft_bounds=TTFT_BOUNDS_S,
            quotas=self.quotas,
            yanks=registry,
        )
        tiers = TierView(
            registry,
            cache,
            engine,
            self.metrics.tier_counters,
            max_loras=info.max_loras,
            max_cpu_loras=info.max_cpu_loras,
        )
        self._background.append(
            asyncio.create_task(tiers.watch_host(_HOST_TIER_REFRESH_S), name="tiers:host")
        )
        self._publish_runtime(engine, registry, tiers, lambda: synchronizer.applied_seq)
        await self._serve_after_first_sync(synchronizer)

    async def _open_cache(self, servable: Callable[[Revision], None]) -> AdapterCache:
        """The disk cache, its leftovers swept, checking each revision with `servable`."""
        assert self._store is not None
        settings = self._settings
        cache = AdapterCache(
            settings.adapter_cache,
            source=self._store,
            check=servable,
            max_bytes=settings.adapter_cache_size,
            observer=self.metrics,
            fetch=FetchSettings(
                direct=settings.direct_downloads,
                read=ReadSettings(range_size=settings.download_range_size),
            ),
        )
        await cache.prepare()
        return cache

    def _publish_runtime(
        self,
        engine: VllmEngine,
        registry: AdapterRegistry,
        tiers: TierView,
        store_seq: Callable[[], int],
    ) -> None:
        """Makes the started parts reachable from both fronts and the metrics."""
        settings = self._settings
        info = engine.info
        admission = Admission(settings.max_pending_requests, settings.max_n)
        gate = fair_gate(settings.admission, info.max_num_seqs)
        slots = SlotGate(info.max_loras) if settings.admission.slot_turns else None
        self.runtime_ref.set(
            Runtime(
                engine=engine,
                registry=registry,
                generator=Generator(
                    engine,
                    registry,
                    admission,
                    self.metrics,
                    gate,
                    slots,
                    self.quotas,
                    push=engine.push if pushed_outputs_supported() else None,
                    tracing=settings.tracing,
                ),
                admission=admission,
                replica_id=settings.replica_id,
                store_seq=store_seq,
                tiers=tiers,
                gate=gate,
                slots=slots,
            )
        )
        self.metrics.watch_engine(
            lora_slots=info.max_loras,
            loaded=lambda: registry.counts().loaded,
            kv_usage=lambda: engine.stats().kv_cache_usage,
            running=lambda: engine.stats().running,
            # Requests waiting for their turn wait for the engine as much as its own queue.
            waiting=lambda: (
                engine.stats().waiting
                + (gate.waiting if gate else 0)
                + (slots.waiting if slots else 0)
            ),
            pending=lambda: admission.pending,
        )
        self.metrics.export_model_server_protocol(
            engine.stats, max_lora=info.max_loras, resident=registry.resident_names
        )
        self.metrics.watch_tiers(tiers.usage)

    async def _compatibility(self, model: str, max_lora_rank: int) -> CompatibilityChecker:
        compat = self._settings.compat
        return CompatibilityChecker(
            max_lora_rank=max_lora_rank,
            target_modules=await asyncio.to_thread(model_lora_targets, Path(model)),
            served_model_name=compat.served_model_name,
            require_base_model_match=compat.require_base_model_match,
            module_shapes=await asyncio.to_thread(model_lora_shapes, Path(model)),
        )

    async def _serve_after_first_sync(self, synchronizer: Synchronizer) -> None:
        """Runs the sync and turns SERVING once its first pass is done; returns at once
        (raising why) if the sync ends before that."""
        assert self._server is not None
        self._sync_task = asyncio.create_task(synchronizer.run(), name="store-sync")
        first_sync = asyncio.ensure_future(synchronizer.initial_sync_done.wait())
        await asyncio.wait({first_sync, self._sync_task}, return_when=asyncio.FIRST_COMPLETED)
        if not first_sync.done():
            first_sync.cancel()
            # The sync ended before its first pass; its error says why.
            await self._sync_task
            return
        await self._server.set_serving(True)
        assert self._engine is not None
        self._engine.tune_for_serving()
        self.ready.set()
        log.info("server.serving port=%d replica_id=%s", self.port, self._settings.replica_id)

    async def stop(self) -> None:
        """Graceful shutdown: NOT_SERVING (new calls still served for the delay), streams
        finish within the grace, then teardown."""
        delay = self._settings.shutdown_delay_seconds
        if delay > 0 and self._server is not None:
            # A load balancer sees NOT_SERVING at its next checks: serve what it sends until.
            log.info("server.draining delay_s=%.1f", delay)
            await self._server.set_serving(False)
            await asyncio.sleep(delay)
        grace = self._settings.shutdown_grace_seconds
        log.info("server.stopping grace_s=%.1f", grace)
        await asyncio.gather(
            *(server.stop(grace) for server in (self._server, self._http) if server is not None)
        )
        tasks = [t for t in (self._sync_task, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._cache is not None:
            await self._cache.close()
        if self._store is not None:
            await self._store.close()
        self.runtime_ref.set(None)
        if self._engine is not None:
            self._engine.tune_for_serving(False)
            self._engine.shutdown()
        log.info("server.stopped")

    async def _auto_rank(self) -> int:
        """The smallest rank covering the store's adapters. A store that cannot be
        reached yet is waited for, as the sync does with a fixed rank: the replica
        stays NOT_SERVING and says why, rather than exiting into a crash loop."""
        attempts = 0
        async for attempt in retrylog.retry_context(
            "inference.auto_rank",
            on=TRANSIENT_ERRORS,
            attempts=None,
            timeout=None,
            wait_initial=_STORE_WAIT_FIRST_S,
            wait_max=_STORE_WAIT_MAX_S,
        ):
            with attempt:
                attempts = attempt.num
                ranks = await self._store_adapter_ranks(attempt)
        self.runtime_ref.set_waiting("")
        rank = smallest_covering_rank(ranks, await asyncio.to_thread(supported_lora_ranks))
        log.info(
            "engine.auto_rank ranks=%s max_lora_rank=%d attempts=%d",
            sorted(set(ranks)),
            rank,
            attempts,
        )
        return rank

    async def _store_adapter_ranks(self, attempt: stamina.Attempt) -> list[int]:
        """One attempt of `_auto_rank`: a transient failure says why the replica waits
        and is raised again to be retried."""
        assert self._store is not None
        compat = self._settings.compat
        try:
            return await current_adapter_ranks(
                self._store,
                compat.served_model_name,
                require_base_model_match=compat.require_base_model_match,
            )
        except TRANSIENT_ERRORS as exc:
            self.runtime_ref.set_waiting(
                f"waiting for the adapter store at {self._settings.store_address} to size "
                f"the engine (--max-lora-rank auto): {exc.message}"
            )
            log.warning(
                "engine.auto_rank_waiting attempt=%d retry_in=%.2fs reason=%s",
                attempt.num,
                attempt.next_wait,
                exc.message,
            )
            raise
        except LoraserveError as exc:
            raise type(exc)(
                f"--max-lora-rank auto could not list the store's adapters: {exc.message}; "
                "fix the store address or credentials, or pass a fixed --max-lora-rank"
            ) from exc


def _sync_settings(settings: InferenceSettings) -> SyncSettings:
    return SyncSettings(
        prefetch_adapters=settings.prefetch_adapters,
        replica_id=settings.replica_id,
        reports=ReportSettings(
            interval_s=settings.status_interval_s,
            flush_s=settings.status_flush_s,
            counters_interval_s=settings.rollout_report_interval_s,
        ),
    )

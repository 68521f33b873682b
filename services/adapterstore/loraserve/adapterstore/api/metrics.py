"""Prometheus metrics of one adapter store, in a registry of its own.

The gauges are read from the store at scrape time, so they cost nothing between
scrapes and can never drift from the state they describe.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge

from loraserve.adapterstore.store import AdapterStore
from loraserve.common.release import add_build_info


class StoreMetrics:
    def __init__(
        self,
        store: AdapterStore,
        registry: CollectorRegistry | None = None,
        storage_format: Callable[[], int] | None = None,
    ) -> None:
        """`storage_format`: the storage format the store writes now (compat/gate.py)."""
        self.registry = registry or CollectorRegistry()
        add_build_info(self.registry)
        if storage_format is not None:
            written = Gauge(
                "loraserve_adapterstore_storage_format",
                "The storage format this store writes now: the newest every live store "
                "on the bucket reads, at most --storage-format.",
                registry=self.registry,
            )
            written.set_function(storage_format)
        seq = Gauge(
            "loraserve_adapterstore_log_seq",
            "Latest store seq this replica has folded in.",
            registry=self.registry,
        )
        seq.set_function(lambda: store.head_seq)
        adapters = Gauge(
            "loraserve_adapterstore_adapters",
            "Adapters in the store (deleted ones excluded).",
            registry=self.registry,
        )
        adapters.set_function(lambda: store.adapter_count)
        watches = Gauge(
            "loraserve_adapterstore_watches",
            "Watch streams open on this replica.",
            registry=self.registry,
        )
        watches.set_function(lambda: store.watch_count)
        stale = Gauge(
            "loraserve_adapterstore_staleness_seconds",
            "Seconds since this replica last read the log's head from object storage.",
            registry=self.registry,
        )
        stale.set_function(lambda: store.staleness_s)

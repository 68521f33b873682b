"""The gRPC surface: AdapterStoreService's servicer, proto conversions, health and
the store's metrics."""

from loraserve.adapterstore.api.health import follow_freshness
from loraserve.adapterstore.api.metrics import StoreMetrics
from loraserve.adapterstore.api.servicer import (
    REPLICA_METHODS,
    SERVICE_NAME,
    WRITE_METHODS,
    AdapterStoreServicer,
    register,
)

__all__ = [
    "REPLICA_METHODS",
    "SERVICE_NAME",
    "WRITE_METHODS",
    "AdapterStoreServicer",
    "StoreMetrics",
    "follow_freshness",
    "register",
]

"""The gRPC surface: AdapterStoreService's servicer, proto conversions, health and
the store's metrics."""

from loraserve.adapterstore.api.health import follow_freshness
from loraserve.adapterstore.api.metrics import StoreMetrics
from loraserve.adapterstore.api.servicer import (
    METHOD_ROLES,
    SERVICE_NAME,
    AdapterStoreServicer,
    register,
)

__all__ = [
    "METHOD_ROLES",
    "SERVICE_NAME",
    "AdapterStoreServicer",
    "StoreMetrics",
    "follow_freshness",
    "register",
]

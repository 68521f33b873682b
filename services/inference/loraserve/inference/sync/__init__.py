"""Following the store: list, then watch; apply each adapter's latest wish to the
registry (route, load, delete) on its own worker, and report ACK/NACK back."""

from loraserve.inference.sync.ranks import current_adapter_ranks
from loraserve.inference.sync.synchronizer import Synchronizer, SyncSettings

__all__ = ["SyncSettings", "Synchronizer", "current_adapter_ranks"]

"""Following the store: list, then watch; apply each adapter's latest wish to the
registry (route, load, rollout split, delete) on its own worker, and report in batches
what this replica routes."""

from loraserve.inference.sync.ranks import current_adapter_ranks
from loraserve.inference.sync.reports import ReportSettings
from loraserve.inference.sync.seams import SyncSettings
from loraserve.inference.sync.synchronizer import Synchronizer

__all__ = ["ReportSettings", "SyncSettings", "Synchronizer", "current_adapter_ranks"]

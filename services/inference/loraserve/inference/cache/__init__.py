"""The disk tier: verified adapter revisions under `--adapter-cache`, downloaded from the
store, bounded by `--adapter-cache-size`, indexed by last use. It alone creates and
deletes the revision directories."""

from loraserve.inference.cache.adapter_cache import AdapterCache, CachedRevision, CacheUsage, Holder
from loraserve.inference.cache.fetching import FetchSettings
from loraserve.inference.cache.http_read import ReadSettings

__all__ = [
    "AdapterCache",
    "CacheUsage",
    "CachedRevision",
    "FetchSettings",
    "Holder",
    "ReadSettings",
]

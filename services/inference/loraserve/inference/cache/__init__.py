"""The disk tier: verified adapter revisions under `--adapter-cache`, downloaded from the
store, bounded by `--adapter-cache-size`, indexed by last use. It alone creates and
deletes the revision directories."""

from loraserve.inference.cache.adapter_cache import AdapterCache, CachedRevision, CacheUsage, Holder

__all__ = ["AdapterCache", "CacheUsage", "CachedRevision", "Holder"]

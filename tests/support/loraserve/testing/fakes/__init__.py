"""In-memory stand-ins for fast unit tests of logic: a blob store, a clock the test moves,
an engine and revision cache, a revision source, the registry, the synchronizer's
fetcher, registry and store."""

__all__ = ["blobs", "clock", "engine", "registry", "revisions", "sync", "sync_store"]

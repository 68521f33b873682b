"""Store fixtures for this folder (a non-root conftest cannot use pytest_plugins)."""

from loraserve.testing.store.stores import memory_blobs, memory_store, open_store

__all__ = ["memory_blobs", "memory_store", "open_store"]

"""Registry fixtures for this folder (a non-root conftest cannot use pytest_plugins)."""

from loraserve.testing.fakes.registry import cache_dir, engine, fetcher, registry

__all__ = ["cache_dir", "engine", "fetcher", "registry"]

"""The loraserve release this process runs, and the metric that says so.

Read from the installed package's metadata (the wheel's, or the editable install's),
so the number has one source: `pyproject.toml`. During a rolling upgrade
`loraserve_build_info` tells which processes run which release.
"""

from __future__ import annotations

import importlib.metadata

from prometheus_client import CollectorRegistry, Info


def _release() -> str:
    try:
        return importlib.metadata.version("loraserve")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


RELEASE = _release()


def add_build_info(registry: CollectorRegistry) -> None:
    """`loraserve_build_info{version="..."} 1` in `registry`."""
    Info("loraserve_build", "The loraserve release this process runs.", registry=registry).info(
        {"version": RELEASE}
    )

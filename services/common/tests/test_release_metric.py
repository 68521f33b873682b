"""Every process says which loraserve release it runs, in its metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from loraserve.common.release import RELEASE, add_build_info


def test_build_info_names_the_release() -> None:
    registry = CollectorRegistry()
    add_build_info(registry)
    assert registry.get_sample_value("loraserve_build_info", {"version": RELEASE}) == 1.0

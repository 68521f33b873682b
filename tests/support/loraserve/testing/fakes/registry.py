"""The registry on a fake engine and a fake cache, for unit tests of its state machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loraserve.common.config.pins import PinPolicy, PinSettings
from loraserve.inference.adapters import (
    LLAMA_TARGET_MODULES,
    AdapterRegistry,
    CompatibilityChecker,
    RevisionCache,
    RevisionLife,
)
from loraserve.testing.fakes.engine import FakeEngine, FakeFetcher


def fake_registry(
    engine: FakeEngine, cache: RevisionCache, max_pinned: int = 2, **options: Any
) -> AdapterRegistry:
    """A registry that admits rank <= 16 on Llama modules of the model "fake-llama" and
    serves every pin, least recently used out first (`options`, e.g. pins, override)."""
    compat = CompatibilityChecker(
        max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name="fake-llama"
    )
    pins = PinSettings(PinPolicy.ANY, idle_s=0, max_pinned=max_pinned)
    return AdapterRegistry(engine, cache, compat, **{"pins": pins, **options})


def state_of(registry: AdapterRegistry, name: str, revision: int) -> RevisionLife | None:
    """The state ListAdapters would show for name@revision; None if it is not listed."""
    for status in registry.snapshot():
        if (status.name, status.revision) == (name, revision):
            return status.state
    return None


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def fetcher(cache_dir: Path) -> FakeFetcher:
    return FakeFetcher(cache_dir)


@pytest.fixture
def registry(engine: FakeEngine, fetcher: FakeFetcher) -> AdapterRegistry:
    return fake_registry(engine, fetcher)

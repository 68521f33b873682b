"""Fixtures for the tiny model and its random LoRA adapters.

Builds are deterministic, so they are cached under the repository's `.cache/tiny/`
(git-ignored) and reused across sessions; a directory's name holds a digest of
everything that went into it, so a changed spec never meets a stale build.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Protocol

import pytest

from loraserve.tiny.adapters import TinyAdapterSpec, build_tiny_adapter
from loraserve.tiny.model import TinyModelSpec, build_tiny_model


class TinyAdapterFactory(Protocol):
    """Builds (or finds cached) a random LoRA adapter for `tiny_model_dir`."""

    def __call__(
        self,
        rank: int = 8,
        seed: int = 0,
        target_modules: tuple[str, ...] | None = None,
        alpha: int | None = None,
    ) -> Path: ...


def _digest(params: object) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


@pytest.fixture(scope="session")
def tiny_cache_dir(pytestconfig: pytest.Config) -> Path:
    """Where built models and adapters are kept between sessions."""
    return pytestconfig.rootpath / ".cache" / "tiny"


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_cache_dir: Path) -> Path:
    """The tiny Llama model with its tokenizer, built with the default spec."""
    spec = TinyModelSpec()
    return build_tiny_model(tiny_cache_dir / f"model-{_digest(asdict(spec))}", spec)


@pytest.fixture(scope="session")
def tiny_adapter(tiny_model_dir: Path) -> TinyAdapterFactory:
    """A factory: `tiny_adapter(rank=8, seed=0, target_modules=None, alpha=None) -> Path`."""
    adapters_dir = tiny_model_dir.parent / f"{tiny_model_dir.name}-adapters"

    def build(
        rank: int = 8,
        seed: int = 0,
        target_modules: tuple[str, ...] | None = None,
        alpha: int | None = None,
    ) -> Path:
        spec = (
            TinyAdapterSpec(rank=rank, seed=seed, alpha=alpha)
            if target_modules is None
            else TinyAdapterSpec(rank=rank, seed=seed, alpha=alpha, target_modules=target_modules)
        )
        name = f"r{rank}-s{seed}-{_digest(asdict(spec))}"
        return build_tiny_adapter(tiny_model_dir, adapters_dir / name, spec)

    return build

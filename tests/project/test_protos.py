"""The committed gRPC stubs are what `proto/` generates today."""

from __future__ import annotations

from pathlib import Path

from loraserve.protogen import stale_files

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_match_a_fresh_generation() -> None:
    assert stale_files(REPO_ROOT) == [], "run `make proto` and commit the result"

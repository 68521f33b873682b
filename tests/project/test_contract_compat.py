"""The gRPC contracts still serve every client of the previous release
(`[tool.loraserve.compat] previous-release`, read from git: a clone without that history
fails here, with what to fetch, rather than skipping the check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.protocompat.__main__ import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_contracts_are_compatible_with_the_previous_release(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["--root", str(REPO_ROOT)])
    output = capsys.readouterr()
    assert status == 0, f"make proto-compat:\n{output.out}{output.err}"

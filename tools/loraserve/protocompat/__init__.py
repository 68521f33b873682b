"""A buf-breaking-style check of the gRPC contracts against the previous release.

`python -m loraserve.protocompat` compiles `proto/` as it was at the release that
`[tool.loraserve.compat] previous-release` names (read with `git archive`) and as it is
in the working tree, and reports every change that breaks a client of the old contracts
(`rules`); `tests/project/test_contract_compat.py` runs it with the suite, `make proto-compat`
on its own.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from loraserve.protocompat.breaks import Break
from loraserve.protocompat.descriptors import Contracts, compile_protos, index
from loraserve.protocompat.gitref import export_protos
from loraserve.protocompat.rules import compare


@dataclass(frozen=True)
class Report:
    """The working tree's contracts against those of a git ref."""

    ref: str
    commit: str
    old: Contracts
    breaks: list[Break]


def check(root: Path, ref: str) -> Report:
    """Compares `root`'s `proto/` with the one at `ref` in `root`'s git history."""
    with tempfile.TemporaryDirectory() as tmp:
        commit = export_protos(root, ref, Path(tmp))
        old = index(compile_protos(Path(tmp) / "proto"))
    new = index(compile_protos(root / "proto"))
    return Report(ref, commit, old, compare(old, new))

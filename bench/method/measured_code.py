"""The code each benchmark measures, as git pathspecs, and how far a run of it is behind
HEAD there.

A figure describes the code it ran on; the README says which commit that was and, when
the code a benchmark declares has changed since, by how many commits and for how many
days (`Age`). Ages are shown, never a failure: a change that claims no performance
effect lands without rerunning anything, and a benchmark whose code changed more than
`STALE_AFTER_DAYS` before HEAD is shown stale until someone reruns it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ALL_CODE", "MEASURES", "STALE_AFTER_DAYS", "Age", "age", "head"]

STALE_AFTER_DAYS = 30
_DAY_S = 86_400

# The services' own tests run in no benchmark.
_NO_TESTS = ":(exclude)services/*/tests/*"
# The versions every benchmark ran with: vLLM, torch, grpcio and the rest.
_VERSIONS = ("constraints", "pyproject.toml")
_STORE = ("services/adapterstore/loraserve", "proto/loraserve/adapterstore")
_CTL = ("services/adapterctl/loraserve",)
_COMMON = ("services/common/loraserve",)
_INFERENCE = ("services/inference/loraserve", "proto/loraserve/inference")
_NATIVE = ("services/inference/native",)
# The replica's adapter downloads (the cache and its readers).
_REPLICA_CACHE = ("services/inference/loraserve/inference/cache",)
_ENGINE = tuple(
    f"services/inference/loraserve/inference/{part}"
    for part in ("engine", "serving", "adapters", "settings", "app.py", "__main__.py")
)
# What a streamed Generate passes through, from the engine to the wire.
_STREAM = (
    *_ENGINE,
    *(f"services/inference/loraserve/inference/{part}" for part in ("transport", "openai", "v1")),
    "proto/loraserve/inference",
    "services/common/loraserve/common/rpc",
    "services/common/loraserve/clients",
    *_NATIVE,
)
# Everything a push crosses: the CLI, the store, the replica's sync, cache and engine.
_PUBLISH = (*_CTL, *_STORE, *_COMMON, *_INFERENCE, *_NATIVE)
_SERVE = (*_INFERENCE, *_COMMON, *_NATIVE)
_TRANSFERS = (*_CTL, *_STORE, *_COMMON, *_REPLICA_CACHE)

MEASURES: dict[int, tuple[str, ...]] = {
    1: _STREAM,
    2: _SERVE,
    3: _SERVE,
    4: _PUBLISH,
    5: _PUBLISH,
    6: _TRANSFERS,
    7: _SERVE,
    8: _STREAM,
    9: _PUBLISH,
    10: _SERVE,
    11: _PUBLISH,
    12: (*_STORE, *_CTL, *_COMMON),
    13: _STREAM,
    14: _TRANSFERS,
    15: (*_STORE, *_COMMON, *_REPLICA_CACHE),
    16: _PUBLISH,
    17: _PUBLISH,
    18: _SERVE,
    19: _SERVE,
    20: _PUBLISH,
    21: (*_STORE, *_COMMON, *_REPLICA_CACHE),
    22: _PUBLISH,
}

# Any code some benchmark measures: a run made with uncommitted changes here describes
# no commit.
ALL_CODE = ("services", "proto", *_VERSIONS, _NO_TESTS)


@dataclass(frozen=True)
class Age:
    """How far a run of one benchmark is behind HEAD in the code that benchmark measures."""

    # Commits since the run's that changed the declared code.
    commits: int = 0
    # From the first of those commits to HEAD, in whole days.
    days: int = 0
    # Why the run describes no commit of this history ("" when it does).
    unknown: str = ""

    @property
    def stale(self) -> bool:
        return bool(self.unknown) or self.days > STALE_AFTER_DAYS

    def describe(self) -> str:
        """ "" when the code is as measured; else what changed, as the README says it."""
        if self.unknown:
            return self.unknown
        if not self.commits:
            return ""
        commits = f"{self.commits} commit{'s' if self.commits != 1 else ''}"
        return f"code changed since ({commits}, {self.days} day{'s' if self.days != 1 else ''})"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def head(repo: Path) -> tuple[str, int]:
    """HEAD's commit and its commit time (Unix seconds): what ages are measured to."""
    commit, seconds = _git(repo, "log", "-1", "--format=%H %ct", "HEAD").split()
    return commit, int(seconds)


def _changes(repo: Path, commit: str, paths: tuple[str, ...]) -> tuple[int, ...]:
    """Commit times of the commits after `commit` up to HEAD that touched `paths`."""
    out = _git(repo, "log", "--format=%ct", f"{commit}..HEAD", "--", *paths, _NO_TESTS)
    return tuple(int(line) for line in out.split())


def age(number: int, commit: str, uncommitted: str, repo: Path) -> Age:
    """The age of benchmark `number`'s figures from a run at `commit` (`uncommitted`:
    the code paths it ran with changes in, "" for none)."""
    if uncommitted:
        return Age(unknown=f"measured with uncommitted changes in {uncommitted}")
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        return Age(unknown=f"measured at an unknown commit ({commit!r})")
    try:
        times = _changes(repo, commit, (*MEASURES.get(number, ("services", "proto")), *_VERSIONS))
    except (OSError, subprocess.CalledProcessError):
        return Age(unknown="its commit is not in this history")
    if not times:
        return Age()
    return Age(len(times), max(0, (head(repo)[1] - min(times)) // _DAY_S))

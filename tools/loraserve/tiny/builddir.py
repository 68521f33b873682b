"""Build an output directory at most once: atomically, and as a no-op when it is already there.

A build writes into a temporary sibling directory, records its parameters in a marker
file last, then renames the directory into place. A reader therefore never sees a
half-written directory, and a directory whose marker holds the same parameters is
known complete, so the caller may skip the work.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

# A dotfile, so that tools copying "the adapter files" out of a directory can skip it.
MARKER = ".loraserve-tiny.json"

JsonScalar = str | int | float | bool | None
Params = Mapping[str, JsonScalar | list[str]]


class BuildConflictError(Exception):
    """The output directory exists and was not built by this tool with these parameters."""


def read_marker(out_dir: Path) -> dict[str, object] | None:
    """The parameters a completed build recorded in `out_dir`, or None if there are none."""
    try:
        data = json.loads((out_dir / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


def build_once(out_dir: Path, params: Params, write: Callable[[Path], None]) -> Path:
    """Make `out_dir` hold what `write` produces for `params`, building it only if needed.

    `write` receives an empty directory to fill. Raises BuildConflictError rather than
    overwrite a directory that holds something else.
    """
    out_dir = out_dir.absolute()
    wanted = json.loads(json.dumps(params))
    if _is_built(out_dir, wanted):
        log.debug("tiny.build.cached dir=%s", out_dir)
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(staging)
        (staging / MARKER).write_text(json.dumps(wanted, sort_keys=True, indent=2) + "\n")
        try:
            staging.rename(out_dir)
        except OSError:
            # Another process may have finished the same build first; that is success.
            if not _is_built(out_dir, wanted):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    log.info("tiny.build.done dir=%s", out_dir)
    return out_dir


def _is_built(out_dir: Path, wanted: object) -> bool:
    if not out_dir.exists():
        return False
    found = read_marker(out_dir)
    if found == wanted:
        return True
    if found is None and out_dir.is_dir() and not any(out_dir.iterdir()):
        # An empty directory holds nothing to lose; let the rename replace it.
        out_dir.rmdir()
        return False
    raise BuildConflictError(
        f"{out_dir} exists and was not built with these parameters "
        f"(found {found!r}, want {wanted!r}); remove it or choose another directory"
    )

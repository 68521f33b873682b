"""The order modules reach pytest-xdist's workers in (`make test` runs two).

xdist hands out whole modules (`--dist loadfile`) in collection order once
`--no-loadscope-reorder` is given; its default puts the modules with the fewest tests
last, and those are the ones that start replicas of their own, so one worker was left
with minutes of them while the other idled. Here, on a worker, the modules with a test
marked `slow` come first, in their collection order; the many short tests after them
fill both workers to the end. Among the slow ones, a module that waits for the demo's
training (`demo_trained`, started in the background at collection) comes last: handed
out first, its worker stood idle for the whole training (minutes on a fresh clone),
and by the time the other slow modules are done the training mostly is too. A run in
one process keeps the collection order.

Within each of those groups the modules go longest first, by the seconds a whole run
recorded for each (`tests/module_durations.json`, written by `make test
RECORD_DURATIONS=1`), so the last module handed out is a short one and neither worker is
left with minutes alone at the end. A module that recorded more than `SLOW_S` counts as
slow even unmarked; one not recorded yet keeps its place in collection order after the
recorded ones of its group.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# The fixture that waits for the warm-up's training (loraserve.testing.plugins.demo_warmup).
_WAITS_FOR_TRAINING = "demo_trained"
# Where each module's seconds are recorded, relative to the root.
DURATIONS = Path("tests") / "module_durations.json"
# Recorded seconds past which a module is scheduled with the slow ones.
SLOW_S = 20.0


def recorded_durations(root: Path) -> dict[str, float]:
    """Each module's recorded seconds by its path from the root; {} where none are."""
    try:
        recorded = json.loads((root / DURATIONS).read_text())
    except FileNotFoundError:
        return {}
    return {str(module): float(seconds) for module, seconds in recorded.items()}


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return
    seconds = recorded_durations(config.rootpath)
    slow = {
        _module(item)
        for item in items
        if item.get_closest_marker("slow") is not None or seconds.get(_module(item), 0) > SLOW_S
    }
    waiting = {
        _module(item) for item in items if _WAITS_FOR_TRAINING in getattr(item, "fixturenames", ())
    }

    def order(item: pytest.Item) -> tuple[bool, bool, float]:
        module = _module(item)
        return (module not in slow, module in waiting, -seconds.get(module, -1.0))

    items.sort(key=order)

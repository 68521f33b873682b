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

The modules that share the session's fleet of processes (`process_fleet`) are one unit
of work, on one worker, in the order `FLEET_MODULES` gives: on two workers each would
start a fleet of its own. A test of a module that asks for the fleet and is not listed
there fails, before the fleet starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# The fixture that waits for the warm-up's training (loraserve.testing.plugins.demo_warmup).
_WAITS_FOR_TRAINING = "demo_trained"
# Where each module's seconds are recorded, relative to the root.
DURATIONS = Path("tests") / "module_durations.json"
# Recorded seconds past which a module is scheduled with the slow ones.
SLOW_S = 20.0
# The modules that use `process_fleet` (loraserve.testing.processes.fleet), in the order
# they run: test_fleet's last test SIGKILLs a replica.
FLEET_MODULES = (
    "tests/reliability/test_tracing_fleet.py",
    "tests/test_fleet_rollouts.py",
    "tests/test_fleet.py",
)
_FLEET_FIXTURE = "process_fleet"
_UNLISTED = pytest.StashKey[str]()


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
    for item in items:
        if (
            _FLEET_FIXTURE in getattr(item, "fixturenames", ())
            and _module(item) not in FLEET_MODULES
        ):
            item.stash[_UNLISTED] = (
                f"{_module(item)} uses {_FLEET_FIXTURE} but is not in "
                "loraserve.testing.plugins.scheduling.FLEET_MODULES: it would start a fleet"
            )
    if not hasattr(config, "workerinput"):
        return
    seconds = recorded_durations(config.rootpath)
    # The fleet's modules go out as one, by their seconds together, in their order.
    together = sum(seconds.get(module, 0.0) for module in FLEET_MODULES)
    seconds.update(dict.fromkeys(FLEET_MODULES, together))
    slow = {
        _module(item)
        for item in items
        if item.get_closest_marker("slow") is not None or seconds.get(_module(item), 0) > SLOW_S
    }
    waiting = {
        _module(item) for item in items if _WAITS_FOR_TRAINING in getattr(item, "fixturenames", ())
    }

    def order(item: pytest.Item) -> tuple[bool, bool, float, int]:
        module = _module(item)
        place = FLEET_MODULES.index(module) if module in FLEET_MODULES else 0
        return (module not in slow, module in waiting, -seconds.get(module, -1.0), place)

    items.sort(key=order)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture: the fleet is never started for a module it is not kept for.
    unlisted = item.stash.get(_UNLISTED, None)
    if unlisted is not None:
        pytest.fail(unlisted, pytrace=False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the fleet's modules one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    # xdist ships no type hints: its scheduler is Any to mypy.
    class SharedFleetScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return FLEET_MODULES[0] if module in FLEET_MODULES else module

    return SharedFleetScheduling(config, log)

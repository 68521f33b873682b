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
"""

from __future__ import annotations

import pytest

# The fixture that waits for the warm-up's training (loraserve.testing.plugins.demo_warmup).
_WAITS_FOR_TRAINING = "demo_trained"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    waiting = {
        item.path for item in items if _WAITS_FOR_TRAINING in getattr(item, "fixturenames", ())
    }
    items.sort(key=lambda item: (item.path not in slow, item.path in waiting))

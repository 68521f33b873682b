"""How one arm is split over several load-generator processes (bench.load.fanout)."""

from __future__ import annotations

from bench.load.drive import Load
from bench.load.fanout import _split
from bench.load.loadclient import Arm
from bench.load.targets import Target
from bench.load.workload import Workload

ARM = Arm(
    "bounded",
    Target("fleet_bounded", "127.0.0.1:1,127.0.0.1:2"),
    Workload(adapters=("a", "b", "c"), concurrency=10, requests=30, max_tokens=4, seed=5),
    Load("closed", concurrency=10),
    (("front", 1),),
)


def test_each_process_draws_its_own_requests() -> None:
    parts = _split(ARM, 4)
    assert [part.workload.seed for part in parts] == [5, 6, 7, 8]
    assert len({tuple(a for a, _ in part.workload.schedule()) for part in parts}) == 4


def test_the_concurrency_is_shared_and_the_cpu_watched_once() -> None:
    parts = _split(ARM, 4)
    assert [part.load.concurrency for part in parts] == [3, 3, 2, 2]
    assert [part.watch for part in parts] == [(("front", 1),), (), (), ()]

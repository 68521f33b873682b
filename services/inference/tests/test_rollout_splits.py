"""Which arm of a rollout each request goes to (issue 25, item 3): the weight's share
of keyless requests, one revision per caller key on every replica, and a rollout
that ended or weighs 0 sending nothing to the candidate."""

from __future__ import annotations

import random

from loraserve.clients.store import RolloutSplit
from loraserve.inference.adapters.rollouts import Splits
from loraserve.testing.fakes.sync_store import manifest


def split(weight: float, candidate: int = 2) -> RolloutSplit:
    return RolloutSplit(manifest("alpha", candidate), weight, start_seq=5)


def candidate_share(splits: Splits, keys: list[str]) -> float:
    chosen = [splits.choose_candidate("alpha", key) is not None for key in keys]
    return sum(chosen) / len(chosen)


def test_weight_20_sends_20_percent_of_1000_keyless_requests_within_3_points() -> None:
    for seed in range(20):
        splits = Splits(random.Random(seed))
        splits.set("alpha", split(20))
        assert abs(candidate_share(splits, [""] * 1000) - 0.20) <= 0.03


def test_weight_20_sends_about_20_percent_of_1000_distinct_keys() -> None:
    splits = Splits()
    splits.set("alpha", split(20))
    assert abs(candidate_share(splits, [f"user-{i}" for i in range(1000)]) - 0.20) <= 0.03


def test_one_key_gets_the_same_arm_on_every_replica() -> None:
    replicas = [Splits(random.Random(seed)) for seed in range(3)]
    for splits in replicas:
        splits.set("alpha", split(50))
    for i in range(200):
        key = f"user-{i}"
        arms = {splits.choose_candidate("alpha", key) is not None for splits in replicas}
        repeated = {replicas[0].choose_candidate("alpha", key) is not None for _ in range(3)}
        assert len(arms) == 1
        assert repeated == arms


def test_raising_the_weight_only_moves_keys_towards_the_candidate() -> None:
    splits = Splits()
    keys = [f"user-{i}" for i in range(500)]
    splits.set("alpha", split(10))
    at_10 = {k for k in keys if splits.choose_candidate("alpha", k) is not None}
    splits.set("alpha", split(50))
    at_50 = {k for k in keys if splits.choose_candidate("alpha", k) is not None}
    assert at_10 < at_50


def test_weight_0_and_an_ended_rollout_send_nothing_to_the_candidate() -> None:
    splits = Splits()
    splits.set("alpha", split(0))
    assert candidate_share(splits, ["", "user-1"] * 50) == 0
    splits.set("alpha", split(100))
    assert candidate_share(splits, ["", "user-1"] * 50) == 1
    splits.end("alpha")
    assert candidate_share(splits, ["", "user-1"] * 50) == 0

"""Which arm of a rollout each request goes to (issue 25, item 3): the weight's share
of keyless requests, one revision per caller key on every replica, and a rollout
that ended or weighs 0 sending nothing to the candidate; (issue 54, item 2) whose key
it is: the credential's principal, a caller-supplied key only when trusted."""

from __future__ import annotations

import contextvars
import random

import pytest

from loraserve.clients.store import RolloutSplit
from loraserve.common.rpc.security import Role, current_principal, current_role
from loraserve.inference.adapters.rollouts import RolloutCaller, RolloutKeys, Splits, peer_host
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


def caller_as(principal: str | None, keys: RolloutKeys, claimed: str, peer: str) -> RolloutCaller:
    """What `keys` make of a request from `principal` (None: no credential)."""

    def derive() -> RolloutCaller:
        if principal is not None:
            current_principal.set(principal)
            current_role.set(Role.READER)
        return keys.caller(claimed, peer)

    return contextvars.copy_context().run(derive)


def test_the_principal_picks_the_arm_whatever_key_the_caller_claims() -> None:
    caller = caller_as("alice", RolloutKeys(), "user-9", "10.0.0.7")
    assert caller == RolloutCaller(key="alice", identity="alice")


def test_a_claimed_key_picks_the_arm_where_it_is_trusted() -> None:
    caller = caller_as("gateway", RolloutKeys(trust_claimed=True), "user-9", "10.0.0.7")
    assert caller == RolloutCaller(key="user-9", identity="user-9")


def test_without_a_credential_requests_spread_and_callers_are_told_apart_by_address() -> None:
    caller = caller_as(None, RolloutKeys(), "user-9", "10.0.0.7")
    assert caller == RolloutCaller(key="", identity="10.0.0.7")


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:10.0.0.7:51234", "10.0.0.7"), ("ipv6:[::1]:5000", "[::1]"), ("", "")],
)
def test_a_peer_is_named_by_its_address_without_the_port(peer: str, host: str) -> None:
    assert peer_host(peer) == host

"""The logic of `--wait N`: which replicas' answers count. A fake status reader stands in
for the store (test_cli_push_wait.py runs the command against a real one), so the order
of "the wait began" and "a replica appeared" is fixed, not raced."""

from __future__ import annotations

from typing import Any

from loraserve.adapterctl.commands.fleet_wait import wait_for_replicas
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb

LIVE = pb.REPLICA_LIVENESS_LIVE
ROUTED = pb.REVISION_SERVING_STATE_ROUTED


def _status(replica: str, revision: int | None) -> pb.ReplicaAdapterStatus:
    revisions = [pb.RevisionStatus(revision=revision, state=ROUTED)] if revision else []
    return pb.ReplicaAdapterStatus(
        replica_id=replica, adapter_name="alpha", liveness=LIVE, revisions=revisions
    )


class _Fleet:
    """Answers GetAdapterStatus with one prepared list of statuses per look."""

    def __init__(self, looks: list[list[pb.ReplicaAdapterStatus]]) -> None:
        self._looks = looks

    def GetAdapterStatus(self, request: Any, timeout: float | None = None) -> Any:
        look = self._looks.pop(0) if len(self._looks) > 1 else self._looks[0]

        async def answer() -> pb.GetAdapterStatusResponse:
            return pb.GetAdapterStatusResponse(statuses=look)

        return answer()


async def _wait(fleet: _Fleet, wanted: int) -> Any:
    return await wait_for_replicas(fleet, "alpha", 2, 7, wanted, timeout_s=0.5, call_timeout_s=1)


async def test_wait_n_ignores_an_ack_from_a_replica_that_joined_after_it_began() -> None:
    began = [_status("r1", None), _status("r2", None)]
    later = [_status("r1", 2), _status("r2", None), _status("late-joiner", 2)]
    outcome = await _wait(_Fleet([began, later]), wanted=2)
    assert (outcome.acked, outcome.timed_out) == (["r1"], True)


async def test_wait_n_counts_acks_of_replicas_live_when_it_began() -> None:
    began = [_status("r1", None), _status("r2", None)]
    later = [_status("r1", 2), _status("r2", 2)]
    outcome = await _wait(_Fleet([began, later]), wanted=2)
    assert (outcome.acked, outcome.timed_out) == (["r1", "r2"], False)

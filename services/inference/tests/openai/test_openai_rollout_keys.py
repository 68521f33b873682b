"""The OpenAI front's rollout key (issue 54, item 2) on a fake engine: the request's `user`
field is a key the caller chooses, so it picks a rollout's arm only where the replica
trusts it (--trust-rollout-key-header); otherwise requests spread by the weight."""

from __future__ import annotations

from pathlib import Path

from loraserve.clients.store import RolloutSplit
from loraserve.inference.adapters import RolloutKeys
from loraserve.inference.adapters.rollouts import key_fraction
from loraserve.testing.fakes.engine import make_revision
from loraserve.testing.inference.openai_front import Front, StartFront

# Its hash puts it on the candidate's side of alpha@4's 50 % split.
USER = "user-2"


async def _front_splitting(start_front: StartFront, tmp_path: Path) -> Front:
    """A front serving alpha@3 with half its requests to the candidate alpha@4."""
    front = await start_front()
    candidate = make_revision(tmp_path, "alpha", 4).manifest
    front.runtime_ref.get().registry.set_rollout("alpha", RolloutSplit(candidate, 50.0, 5))
    return front


async def _models_serving(front: Front, user: str, requests: int = 10) -> set[str]:
    client = front.client()
    served = set()
    for _ in range(requests):
        completion = await client.completions.create(
            model="alpha", prompt="hi", max_tokens=1, user=user
        )
        served.add(completion.model)
    return served


def test_the_user_falls_on_the_candidates_side() -> None:
    assert key_fraction("alpha", 4, USER) < 0.5


async def test_the_openai_user_field_does_not_pick_the_arm(
    start_front: StartFront, tmp_path: Path
) -> None:
    front = await _front_splitting(start_front, tmp_path)
    assert await _models_serving(front, USER) == {"alpha@3", "alpha@4"}


async def test_the_openai_user_field_picks_the_arm_where_it_is_trusted(
    start_front: StartFront, tmp_path: Path
) -> None:
    front = await _front_splitting(start_front, tmp_path)
    front.runtime_ref.rollout_keys = RolloutKeys(trust_claimed=True)
    assert await _models_serving(front, USER) == {"alpha@4"}

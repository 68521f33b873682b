"""How the folded state follows the log."""

from __future__ import annotations

import json

import pytest

from loraserve.adapterstore.catalog.model import Change, ChangeType, StoreState, now
from loraserve.common.errors import DataLoss
from loraserve.common.revisions.manifest import FileInfo, Revision


def _revision(name: str, number: int, seq: int) -> Revision:
    return Revision(
        name,
        number,
        (FileInfo("adapter_config.json", 3, "a" * 64),),
        "m",
        4,
        8.0,
        ("q_proj",),
        now(),
        "tester",
        "",
        seq,
    )


def _pushed(state: StoreState, name: str, promote: bool = True) -> Change:
    seq = state.seq + 1
    revision = _revision(name, state.next_revision(name), seq)
    adapter = state.adapters.get(name)
    current = revision.revision if promote else (adapter.current_revision if adapter else 0)
    return Change(seq, ChangeType.REVISION_PUSHED, name, revision, current, now(), "tester")


def _deleted(state: StoreState, name: str) -> Change:
    return Change(state.seq + 1, ChangeType.ADAPTER_DELETED, name, None, 0, now(), "tester")


def test_push_numbers_revisions_from_one_and_moves_current() -> None:
    state = StoreState()
    state.apply(_pushed(state, "a"))
    state.apply(_pushed(state, "a"))
    assert state.adapters["a"].current_revision == 2
    assert sorted(state.adapters["a"].revisions) == [1, 2]
    assert state.seq == 2


def test_push_without_promote_keeps_current() -> None:
    state = StoreState()
    state.apply(_pushed(state, "a"))
    state.apply(_pushed(state, "a", promote=False))
    assert state.adapters["a"].current_revision == 1
    assert state.adapters["a"].latest_revision == 2


def test_revision_numbers_continue_after_delete() -> None:
    state = StoreState()
    state.apply(_pushed(state, "a"))
    state.apply(_pushed(state, "a"))
    state.apply(_deleted(state, "a"))
    assert "a" not in state.adapters
    state.apply(_pushed(state, "a"))
    assert sorted(state.adapters["a"].revisions) == [3]


def test_out_of_order_change_is_refused() -> None:
    state = StoreState()
    change = _pushed(state, "a")
    state.apply(change)
    with pytest.raises(DataLoss, match="out of order"):
        state.apply(change)


def test_promote_of_unknown_revision_is_refused() -> None:
    state = StoreState()
    state.apply(_pushed(state, "a"))
    bad = Change(2, ChangeType.CURRENT_REVISION_SET, "a", _revision("a", 7, 1), 7, now(), "t")
    with pytest.raises(DataLoss, match="unknown"):
        state.apply(bad)


def test_state_survives_a_json_round_trip() -> None:
    state = StoreState()
    for name in ("b", "a", "a"):
        state.apply(_pushed(state, name))
    state.apply(_deleted(state, "b"))
    assert StoreState.from_json(state.to_json()) == state


def test_change_survives_a_json_round_trip() -> None:
    change = _pushed(StoreState(), "a")
    assert Change.from_json(change.to_json()) == change


def test_snapshot_encoding_is_the_states_json_after_every_kind_of_change() -> None:
    state = StoreState()
    for name in ("b", "a", "c"):
        state.apply(_pushed(state, name))
    state.encode()  # caches every adapter's encoding
    state.apply(_pushed(state, "a", promote=False))
    state.apply(_deleted(state, "b"))
    state.apply(_pushed(state, "b"))
    state.apply(_pushed(state, "aa"))
    expected = json.dumps(state.to_json(), separators=(",", ":")).encode()
    assert state.encode() == expected
    assert StoreState.from_json(json.loads(state.encode())) == state

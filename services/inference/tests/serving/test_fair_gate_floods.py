"""FairGate during a flood: the places the other adapters are expected to need (their
rates times how long their requests hold a place, and their bursts) are kept from an
adapter over its fair rate, though never below its fair share; what a held-back flood
asks for is judged by its holds in a full engine, so it stays held."""

from __future__ import annotations

from loraserve.inference.serving.fairness import FairGate
from loraserve.testing.fakes.clock import ManualClock
from loraserve.testing.inference.fair_gate import gate_after as _after
from loraserve.testing.inference.fair_gate import history as _history

# Seven adapters each holding about one place (2 requests/s of 0.5 s), and `flood` at
# 10x their rate: over its fair rate, and with it they ask for more than 16 places.
BUSY = {"flood": 20.0, **{name: 2.0 for name in "abcdefg"}}


async def test_places_the_other_adapters_are_expected_to_need_are_kept_from_a_flood() -> None:
    holders = await _after((BUSY, 60.0, 0.5), capacity=16)
    await holders.send_all(["flood"] * 12)
    # Headroom alone would let it hold 14; the others' 7 places and their bursts are kept.
    assert 1 <= holders.gate.inside <= 4
    await holders.send_all(list("abcdefg"))
    assert holders.gate.waiting == 12 - holders.inside.count("flood")
    await holders.close()


async def test_a_flood_keeps_its_fair_share_of_places_whatever_the_others_need() -> None:
    # The others are expected to need more than every place: flood still holds 16 / 8.
    busy = {name: rate * 2 for name, rate in BUSY.items()}
    holders = await _after((busy, 60.0, 0.5), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert (holders.gate.inside, holders.gate.waiting) == (2, 10)
    await holders.close()


async def test_a_flood_holds_as_many_places_as_the_busiest_of_the_others_not_more() -> None:
    # Each of the others holds 0.75 places (1.25/s of 0.6 s), 5.25 in all: 17 are kept,
    # and flood may hold one place, not 16 / 8: the places the others leave are not free
    # on an engine whose steps slow as the batch grows.
    rates = {"flood": 20.0, **{name: 1.25 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, 0.6), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert (holders.gate.inside, holders.gate.waiting) == (1, 11)
    await holders.close()


async def test_a_popular_adapter_is_kept_only_from_the_headroom_while_all_fit() -> None:
    # popular needs 4 places and the seven others 3.5: 7.5 of 16, nothing is saturated.
    calm = {"popular": 8.0, **{name: 1.0 for name in "abcdefg"}}
    holders = await _after((calm, 60.0, 0.5), capacity=16)
    await holders.send_all(["popular"] * 16)
    assert (holders.gate.inside, holders.gate.waiting) == (14, 2)
    await holders.close()


async def test_the_others_need_is_sized_by_their_own_holds_not_the_floods() -> None:
    # flood asks for 20 places (10/s of 2 s); the others' 0.1 s requests need about 1.4.
    rates = {"flood": 10.0, **{name: 2.0 for name in "abcdefg"}}
    holds = {"flood": 2.0, **{name: 0.1 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, holds), capacity=16)
    await holders.send_all(["flood"] * 16)
    # Sized by a mean over everyone's holds (mostly flood's), the others would keep 16.
    assert holders.gate.inside == 8
    await holders.close()


async def test_places_are_kept_within_seconds_of_a_floods_start() -> None:
    others = {name: 2.0 for name in "abcdefg"}
    # Four seconds in, flood's 10 s rate says it asks for 5 places, its 2 s rate for 13.
    holders = await _after((others, 60.0, 0.5), ({"flood": 30.0, **others}, 4.0, 0.5), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert 1 <= holders.gate.inside <= 4
    await holders.close()


async def test_a_flood_holds_little_more_than_its_share_while_the_others_are_busy() -> None:
    # The others need 3.5 places (2/s of 0.25 s each); flood asks for 20.
    rates = {"flood": 80.0, **{name: 2.0 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, 0.25), capacity=16)
    await holders.send_all(["flood"] * 12)
    # Two deviations (8 kept) would let flood hold 8, three (10 kept) 6; five keep 13.
    assert holders.gate.inside == 3
    await holders.close()


async def test_a_flood_takes_most_of_the_engine_while_the_others_are_light() -> None:
    # The others need 0.35 places (0.2/s of 0.25 s each): 4 are kept.
    rates = {"flood": 80.0, **{name: 0.2 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, 0.25), capacity=16)
    await holders.send_all(["flood"] * 14)
    assert holders.gate.inside == 12
    await holders.close()


async def test_a_held_flood_stays_held_while_its_requests_run_quicker() -> None:
    # Held back, the flood's requests run in a smaller batch and leave sooner: 15 of
    # the 16 places asked for, below the capacity but not by the margin.
    holders = await _after((BUSY, 60.0, 0.5), (BUSY, 5.0, 0.35), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert 1 <= holders.gate.inside <= 4
    await holders.close()


async def test_a_popular_adapter_gets_all_it_asks_once_all_fit_again_after_a_flood() -> None:
    # popular (10/s) is over its fair rate; with the others it asks for 8.7 of 16
    # places, well below saturation: kept only from the headroom again.
    calm = {"popular": 8.0, **{name: 2.0 for name in "abcdefg"}}
    holders = await _after((BUSY, 60.0, 0.5), (calm, 10.0, 0.3), capacity=16)
    await holders.send_all(["popular"] * 16)
    assert (holders.gate.inside, holders.gate.waiting) == (14, 2)
    await holders.close()


async def test_what_a_held_flood_asks_for_is_judged_by_its_holds_in_a_full_engine() -> None:
    # Alone, flood filled the engine with 0.5 s requests; held back beside the others
    # its requests take 0.25 s: 11 places asked at that, 18.5 at its full-engine hold.
    alone = {"flood": 40.0}
    rates = {"flood": 30.0, **{name: 2.0 for name in "abcdefg"}}
    holders = await _after((alone, 10.0, 0.5), (rates, 60.0, 0.25), capacity=16)
    await holders.send_all(["flood"] * 12)
    # The others' 3.5 places and their bursts (13) are kept.
    assert holders.gate.inside == 3
    await holders.close()


async def test_a_burst_of_the_others_filling_the_engine_does_not_let_a_held_flood_in() -> None:
    # Every step slows with the batch: a request holds its place 0.5 s in a full engine,
    # 0.25 s beside 5 others. Twelve adapters send together every two seconds, and each
    # burst fills the engine for a moment while the flood is held back: the flood's
    # quick requests then leave a full engine, though they spent most of their time in
    # a small batch. Counted as holds in a full engine, they would make the flood seem
    # to ask for fewer places than there are, and it would be let in again.
    def hold(inside: int) -> float:
        return 0.1 + 0.025 * inside

    clock = ManualClock()
    gate = FairGate(16, lambda _: 1.0, 2, clock)
    rates = {"flood": 30.0, **{name: 0.5 for name in "abcdefghijkl"}}
    await _history(gate, clock, {"flood": 40.0}, 10.0, hold)
    await _history(gate, clock, rates, 30.0, hold)
    peaks = await _history(gate, clock, rates, 60.0, hold)
    # The others' 3 places and their bursts (11) are kept.
    assert peaks["flood"] == 5

"""FairGate's headroom: an adapter admitted above its fair rate (its weighted share of
the recent admissions, which decays once it slows or the others go quiet) is kept out
of the last places of the engine, which stay for the other adapters."""

from __future__ import annotations

import asyncio

from loraserve.testing.inference.fair_gate import gate_after as _after

# A flood: `flood` at 10 requests/s, b and c at 1/s.
FLOOD = {"flood": 10.0, "b": 1.0, "c": 1.0}


async def test_adapters_at_their_fair_rate_share_the_whole_engine() -> None:
    holders = await _after(({"a": 1.0, "b": 1.0}, 20.0))
    await holders.send_all(["a", "a", "b", "a"])
    # No one is over its rate: a's third request takes a place in the headroom.
    assert sorted(holders.inside) == ["a", "a", "a", "b"]
    assert holders.gate.waiting == 0
    await holders.close()


async def test_an_adapter_admitted_above_its_fair_rate_is_kept_out_of_the_headroom() -> None:
    holders = await _after((FLOOD, 20.0))
    await holders.send_all(["flood"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (2, 2)
    await holders.close()


async def test_another_adapters_request_finds_a_free_place_during_a_flood() -> None:
    holders = await _after((FLOOD, 20.0))
    await holders.send_all(["flood"] * 4 + ["b", "d"])
    assert sorted(holders.inside) == ["b", "d", "flood", "flood"]
    assert holders.gate.waiting == 2
    await holders.close()


async def test_a_lone_adapter_is_never_over_its_share() -> None:
    holders = await _after(({"a": 50.0}, 20.0))
    await holders.send_all(["a"] * 5)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 1)
    await holders.close()


async def test_an_adapter_that_stops_flooding_gets_the_headroom_back_as_its_rate_decays() -> None:
    # After the flood every adapter at the same rate: flood's decays towards theirs.
    holders = await _after((FLOOD, 20.0), ({"flood": 1.0, "b": 1.0, "c": 1.0}, 30.0))
    await holders.send_all(["flood"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 0)
    await holders.close()


async def test_an_adapter_quiet_for_a_while_no_longer_shares_the_fair_rate() -> None:
    # b and c stop: a, alone since, is the only adapter sharing the total.
    holders = await _after(({"a": 2.0, "b": 1.0, "c": 1.0}, 20.0), ({"a": 2.0}, 12.0))
    await holders.send_all(["a"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 0)
    await holders.close()


async def test_weights_set_the_fair_rate_above_which_the_headroom_is_kept() -> None:
    # heavy at 5 of every 6 admissions: over 1.5x an equal share, at its weighted one.
    rates = {"heavy": 5.0, "light": 1.0}
    holders = await _after((rates, 20.0), weights=rates)
    await holders.send_all(["heavy"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 0)
    await holders.close()


async def test_an_over_adapters_waiter_goes_in_when_a_place_below_the_headroom_frees() -> None:
    holders = await _after((FLOOD, 20.0), headroom=1)
    await holders.send_all(["flood"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (3, 1)
    await holders.let_go("flood")
    assert (holders.gate.inside, holders.gate.waiting) == (3, 0)
    await holders.close()


async def test_headroom_of_the_whole_capacity_still_lets_an_over_adapter_in() -> None:
    holders = await _after((FLOOD, 20.0), capacity=2, headroom=5)
    await holders.send_all(["flood"] * 2)
    assert (holders.gate.inside, holders.gate.waiting) == (1, 1)
    await holders.close()


async def test_a_cancelled_waiter_of_an_over_adapter_leaves_the_free_place_to_others() -> None:
    holders = await _after((FLOOD, 20.0))
    await holders.send_all(["flood"] * 4)
    gone = holders.task(3)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert (holders.gate.inside, holders.gate.waiting) == (2, 1)
    await holders.send_all(["b", "c"])
    assert sorted(holders.inside) == ["b", "c", "flood", "flood"]
    assert holders.gate.waiting == 1
    await holders.close()


async def test_a_request_admitted_into_the_headroom_as_it_is_cancelled_passes_its_place_on() -> (
    None
):
    holders = await _after((FLOOD, 20.0), capacity=2, headroom=1)
    gate = holders.gate
    await holders.send("flood")
    async with gate.turn("b"):
        await holders.send("flood")
        cancelled = await holders.send("c")
        after = await holders.send("d")
    # b's place is headroom: it went to c (flood is over its rate); c is cancelled
    # before it runs, and the place goes to d, not to flood.
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    await asyncio.sleep(0)
    assert not after.done()
    assert sorted(holders.inside) == ["d", "flood"]
    assert (gate.inside, gate.waiting) == (2, 1)
    await holders.close()

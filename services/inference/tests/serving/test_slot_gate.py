"""LoRA slots in turn (SlotGate): at most `slots` adapters inside, an adapter waiting for
a slot gets one by draining the adapter with the fewest requests inside, and no adapter
asked for without pause keeps the others out."""

from __future__ import annotations

import asyncio
import random

import pytest

from loraserve.inference.serving.slots import SlotGate


class _Requests:
    """Requests held inside the gate until let go, each noted as it gets in."""

    def __init__(self, gate: SlotGate) -> None:
        self.gate = gate
        self.order: list[str] = []
        self._releases: dict[asyncio.Task[None], asyncio.Event] = {}

    async def send(self, adapter: str) -> asyncio.Task[None]:
        """Sends a request of `adapter`; returns once it is inside or waiting."""
        release = asyncio.Event()
        task = asyncio.create_task(self._hold(adapter, release))
        self._releases[task] = release
        await _settle()
        return task

    async def _hold(self, adapter: str, release: asyncio.Event) -> None:
        async with self.gate.turn(adapter):
            self.order.append(adapter)
            await release.wait()

    async def end(self, *tasks: asyncio.Task[None]) -> None:
        for task in tasks:
            self._releases[task].set()
        await asyncio.gather(*tasks)
        await _settle()


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_adapters_within_the_slots_go_in_at_once() -> None:
    requests = _Requests(SlotGate(2))
    tasks = [await requests.send(a) for a in ("a", "b", "a", "b")]
    assert (requests.order, requests.gate.waiting) == (["a", "b", "a", "b"], 0)
    await requests.end(*tasks)


async def test_the_base_model_needs_no_slot() -> None:
    requests = _Requests(SlotGate(1))
    held = await requests.send("a")
    base = await requests.send("")
    assert requests.order == ["a", ""]
    await requests.end(held, base)


async def test_an_adapter_without_a_slot_waits_while_every_slot_is_held() -> None:
    requests = _Requests(SlotGate(1))
    a = await requests.send("a")
    b = await requests.send("b")
    assert (requests.order, requests.gate.waiting) == (["a"], 1)
    await requests.end(a)
    assert requests.order == ["a", "b"]
    await requests.end(b)


async def test_an_adapter_drained_for_another_takes_no_new_request_until_it_is_served() -> None:
    requests = _Requests(SlotGate(1))
    hot = await requests.send("hot")
    cold = await requests.send("cold")
    # vLLM's own order would let this one in beside the first, and the next, and so on.
    hot_again = await requests.send("hot")
    assert (requests.order, requests.gate.waiting) == (["hot"], 2)
    await requests.end(hot)
    assert requests.order == ["hot", "cold"]
    await requests.end(cold)
    assert requests.order == ["hot", "cold", "hot"]
    await requests.end(hot_again)


async def test_the_adapter_drained_is_the_one_with_the_fewest_requests_inside() -> None:
    requests = _Requests(SlotGate(2))
    busy = [await requests.send("busy") for _ in range(3)]
    light = await requests.send("light")
    cold = await requests.send("cold")
    busy.append(await requests.send("busy"))
    light_again = await requests.send("light")
    # The busy adapter keeps taking requests; the light one is drained.
    assert requests.order == ["busy"] * 3 + ["light", "busy"]
    assert requests.gate.waiting == 2
    await requests.end(light)
    assert requests.order[-1] == "cold"
    await requests.end(cold, *busy)
    assert requests.order[-1] == "light"
    await requests.end(light_again)


async def test_adapters_waiting_get_slots_in_the_order_they_asked() -> None:
    requests = _Requests(SlotGate(1))
    first = await requests.send("first")
    waiting = [await requests.send(a) for a in ("c", "b", "d")]
    await requests.end(first)
    for task in waiting:
        await requests.end(task)
    assert requests.order == ["first", "c", "b", "d"]


async def test_a_cancelled_waiter_gives_the_slot_it_asked_for_back_to_the_drained_adapter() -> None:
    requests = _Requests(SlotGate(1))
    hot = await requests.send("hot")
    cold = await requests.send("cold")
    hot_again = await requests.send("hot")
    cold.cancel()
    await _settle()
    # Nobody wants the slot now: the drained adapter's waiting request goes in.
    assert (requests.order, requests.gate.waiting) == (["hot", "hot"], 0)
    await requests.end(hot, hot_again)
    assert requests.gate.resident == ()


async def test_an_adapter_drained_for_one_given_another_slot_takes_requests_again() -> None:
    requests = _Requests(SlotGate(2))
    first = await requests.send("first")
    second = await requests.send("second")
    cold = await requests.send("cold")
    first_again = await requests.send("first")
    assert requests.gate.waiting == 2
    # `second` leaves first: `cold` takes its slot, and `first` need not give its own up.
    await requests.end(second)
    assert requests.order == ["first", "second", "cold", "first"]
    await requests.end(first, first_again, cold)


async def test_a_drained_adapters_slot_goes_to_the_adapter_it_was_drained_for() -> None:
    requests = _Requests(SlotGate(2))
    a = await requests.send("a")
    d = [await requests.send("d"), await requests.send("d")]
    c = await requests.send("c")
    a_again = await requests.send("a")
    b = await requests.send("b")
    # `d` leaves whole: `c` takes its slot, and `a` stays drained, now for `b`.
    await requests.end(*d)
    await requests.end(a)
    assert requests.order == ["a", "d", "d", "c", "b"]
    await requests.end(c, b, a_again)


async def test_a_waiter_cancelled_as_its_adapter_gets_the_slot_passes_it_on() -> None:
    requests = _Requests(SlotGate(1))
    hot = await requests.send("hot")
    cold = await requests.send("cold")
    other = await requests.send("other")
    # Cancelled in the same step the slot frees: it never runs, and `other` is next.
    requests._releases[hot].set()
    cold.cancel()
    await asyncio.gather(hot, return_exceptions=True)
    await _settle()
    with pytest.raises(asyncio.CancelledError):
        await cold
    assert requests.order == ["hot", "other"]
    await requests.end(other)
    assert (requests.gate.resident, requests.gate.waiting) == ((), 0)


async def test_random_arrivals_never_put_more_adapters_inside_than_slots_nor_strand_one() -> None:
    rng = random.Random(7)
    gate = SlotGate(3)
    inside: dict[str, int] = {}
    most = 0

    async def request(adapter: str) -> None:
        nonlocal most
        async with gate.turn(adapter):
            inside[adapter] = inside.get(adapter, 0) + 1
            most = max(most, len(inside))
            for _ in range(rng.randint(0, 5)):
                await asyncio.sleep(0)
            inside[adapter] -= 1
            if not inside[adapter]:
                del inside[adapter]

    adapters = [f"a{i}" for i in range(8)]
    tasks = []
    for _ in range(400):
        # Zipf-like: a few adapters asked for nearly without pause.
        tasks.append(asyncio.create_task(request(adapters[int(rng.paretovariate(1.2)) % 8])))
        for _ in range(rng.randint(0, 2)):
            await asyncio.sleep(0)
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks)
    assert most <= 3
    assert (gate.resident, gate.waiting) == ((), 0)

"""Benchmark 18's pool of never-loaded adapters: each name is used once, and the pool is
topped up between windows from the loads one window has used."""

from __future__ import annotations

import pytest

from bench.real.load_stall import HEADROOM, NeverLoaded


class Pushes:
    def __init__(self) -> None:
        self.asked: list[int] = []

    async def __call__(self, count: int) -> list[str]:
        first = 100 + sum(self.asked)
        self.asked.append(count)
        return [f"more-{i}" for i in range(first, first + count)]


def test_each_never_loaded_name_is_taken_once() -> None:
    pool = NeverLoaded(["a", "b"], Pushes())

    assert [pool.take(), pool.take()] == ["a", "b"]


def test_an_empty_pool_says_so_rather_than_reuse_a_loaded_name() -> None:
    pool = NeverLoaded([], Pushes())

    with pytest.raises(RuntimeError, match="out of never-loaded adapters"):
        pool.take()


async def test_the_pool_is_topped_up_to_headroom_times_the_most_loads_of_a_window() -> None:
    pushes = Pushes()
    pool = NeverLoaded(["a", "b", "c"], pushes)

    await pool.top_up(most_per_window=5)

    assert pushes.asked == [HEADROOM * 5 - 3]
    assert len(pool) == HEADROOM * 5
    assert [pool.take() for _ in range(4)] == ["a", "b", "c", "more-100"]


async def test_a_pool_with_room_for_the_next_windows_pushes_nothing() -> None:
    pushes = Pushes()
    pool = NeverLoaded([f"n{i}" for i in range(10)], pushes)

    await pool.top_up(most_per_window=5)
    await pool.top_up(most_per_window=0)

    assert pushes.asked == []


async def test_a_top_up_says_how_many_it_pushed() -> None:
    pool = NeverLoaded(["a"], Pushes())

    assert await pool.top_up(most_per_window=2) == HEADROOM * 2 - 1
    assert await pool.top_up(most_per_window=2) == 0

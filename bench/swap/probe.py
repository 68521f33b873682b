"""Probing a server until it answers with new weights (benchmark 9 and the real
profile's swaps): one-token greedy streamed /v1/completions requests, back to back,
compared by the token id they return (the random bases' tokenizers do not cover every
id, so text is no reliable witness); and the stages of loraserve's path from the
servers' own log lines."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

PROMPT = [5, 17, 42, 99]
# The tokens of each background stream (bench.swap.arms' serving load).
BACKGROUND_TOKENS = 16
PROBE_TIMEOUT_S = 60.0
# Seconds between probes of a model the server does not serve yet (as benchmark 5's).
NOT_SERVED_RETRY_S = 0.005
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
# loraserve's stages, in path order: (label, log file, event pattern for NAME rev N).
STAGES = (
    ("store committed", "adapterstore", r"adapter\.pushed name={name} rev={rev} "),
    ("event received", "loraserve", r"sync\.event .*name={name} rev={rev} "),
    ("downloaded", "loraserve", r"cache\.downloaded name={name} rev={rev} "),
    ("engine loaded", "loraserve", r"adapter\.loaded name={name} rev={rev} lora_int_id"),
    ("routed", "loraserve", r"adapter\.routed name={name} rev={rev} "),
)


class NotServed(RuntimeError):
    """The server does not serve that model (yet): HTTP 404."""


async def probe(
    session: aiohttp.ClientSession, url: str, model: str
) -> tuple[tuple[int, ...], str, float]:
    """One streamed one-token request: (token ids, model that answered, wall time of
    the first token)."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,
    }
    ids: tuple[int, ...] = ()
    served, first = "", float("nan")
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status == 404:
            raise NotServed(await response.text())
        if response.status != 200:
            raise RuntimeError(f"probe: HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event: dict[str, Any] = json.loads(line[6:])
            served = served or str(event.get("model", ""))
            for choice in event.get("choices", ()):
                if choice.get("token_ids") and not ids:
                    ids, first = tuple(choice["token_ids"]), time.time()
    return ids, served, first


async def probe_until(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    expected: tuple[int, ...],
    served_as: str | None,
) -> float:
    """Probes back to back until the answer is `expected` (and, when given, came from
    the model `served_as`); a model not served yet is probed again NOT_SERVED_RETRY_S
    later. Returns the wall
    time of that answer's first token (NaN: not within PROBE_TIMEOUT_S)."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            ids, served, first = await probe(session, url, model)
        except NotServed:
            # Not back to back: a 404 answers in a millisecond, and a loop of them
            # would take a core from the push it waits for.
            await asyncio.sleep(NOT_SERVED_RETRY_S)
            continue
        if ids == expected and (served_as is None or served == served_as):
            return first
    return float("nan")


async def load_lora(
    session: aiohttp.ClientSession, url: str, name: str, path: Path, *, inplace: bool
) -> None:
    """vLLM's runtime LoRA loading: `POST /v1/load_lora_adapter`."""
    body = {"lora_name": name, "lora_path": str(path), "load_inplace": inplace}
    async with session.post(f"{url}/v1/load_lora_adapter", json=body) as response:
        if response.status != 200:
            raise RuntimeError(
                f"load_lora_adapter: HTTP {response.status}: {await response.text()}"
            )


def log_time(log: Path, pattern: str) -> float:
    """Wall time of the first log line matching `pattern` (NaN: none)."""
    wanted = re.compile(pattern)
    for line in log.read_text(errors="replace").splitlines():
        if wanted.search(line) and (stamp := _STAMP.match(line)):
            parsed = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return parsed.timestamp()
    return float("nan")


async def _streaming(session: aiohttp.ClientSession, url: str, model: str) -> None:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": BACKGROUND_TOKENS,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    while True:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"background: HTTP {response.status}: {await response.text()}")
            async for _ in response.content:
                pass


@contextlib.asynccontextmanager
async def serving(
    session: aiohttp.ClientSession, targets: list[tuple[str, str]], streams: int
) -> AsyncIterator[Callable[[], None]]:
    """`streams` closed-loop streams of `model` on each (url, model) of `targets` for the
    block, as a replica serves traffic while someone publishes. Yields a check that
    raises once a stream has failed (the rounds after it would run without its load);
    a failure not seen by then fails the block's normal exit."""
    tasks = [
        asyncio.create_task(_streaming(session, url, model))
        for url, model in targets
        for _ in range(streams)
    ]

    def alive() -> None:
        for task in tasks:
            if task.done() and not task.cancelled() and (error := task.exception()):
                raise RuntimeError(f"a background stream failed: {error!r}")

    try:
        yield alive
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"{len(failed)} background stream(s) failed: {failed[0]!r}")

"""What the demo shows once the stack is up: the point of loraserve, in two scenes.

1. One prompt, several adapters: each answers in its own voice from one base model.
2. A push while a request streams: the running request finishes on the revision it
   started with; a request sent after the push gets the new revision.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from loraserve.clients.inference import Delta, InferenceClient, Sampling
from loraserve.common.rpc.security import ClientSecurity
from loraserve.demo.publish import push_directory, wait_until_routed

log = logging.getLogger(__name__)

PROMPT = "Tell me about the sea."
# The adapter the second scene changes; it starts as the first voice.
SWAP_ADAPTER = "chameleon"
_GREEDY = Sampling(max_tokens=40, temperature=0.0)
_SHOWN_CHARS = 30
# Longer than the scene shows; the demo cancels it once it has shown its point.
_LONG_GREEDY = Sampling(max_tokens=900, temperature=0.0, ignore_eos=True)
# Request 1 reads like a slow consumer: a small HTTP/2 window that never grows, so its
# stream is still arriving when the push lands, however fast or loaded the machine.
# Whether its revision is still in the engine then depends on the transport: grpc.aio
# makes the server wait for the reader, the native transport buffers what the engine
# made and lets the revision go once the engine is done with it.
_SLOW_READER = (("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0))


@dataclass(frozen=True)
class Showcase:
    """What the scenes need: where the servers are and which adapters to use."""

    store_address: str
    inference_address: str
    security: ClientSecurity
    # Voice name -> its adapter directory, in the order to show them.
    voices: Mapping[str, Path]
    routed_timeout_s: float = 120.0


def one_line(text: str) -> str:
    """Text for one terminal line: the poet's line breaks shown as slashes."""
    return " / ".join(part.strip() for part in text.strip().splitlines() if part.strip())


async def same_prompt_scene(showcase: Showcase, say: Callable[[str], None]) -> dict[str, str]:
    """Runs PROMPT on the base model and every voice; what each answered."""
    say(f'One base model, one prompt, different adapters: "{PROMPT}" (greedy, 40 tokens)')
    answers: dict[str, str] = {}
    width = max(len(name) for name in ("(base)", *showcase.voices))
    async with InferenceClient(showcase.inference_address, showcase.security) as client:
        for name in ("", *showcase.voices):
            completion = await client.generate(name, PROMPT, _GREEDY, timeout=60.0)
            answers[name] = completion.text
            say(f"  {name or '(base)':<{width}}  {one_line(completion.text)}")
    return answers


async def hot_swap_scene(
    showcase: Showcase, first: str, second: str, say: Callable[[str], None]
) -> None:
    """Pushes voice `second` over SWAP_ADAPTER (serving `first`) while a request streams."""
    say("")
    say(
        f'A push while a request streams: adapter "{SWAP_ADAPTER}" answers as the {first}; '
        f"now its next revision, the {second}'s weights, is pushed mid-stream."
    )
    async with (
        InferenceClient(showcase.inference_address, showcase.security) as client,
        InferenceClient(
            showcase.inference_address, showcase.security, channel_options=_SLOW_READER
        ) as slow_reader,
    ):
        stream = slow_reader.stream(SWAP_ADAPTER, PROMPT, _LONG_GREEDY, timeout=120.0)
        try:
            opened = await anext(stream)
            # A few words first, so that the voice it started in is plain to see.
            before = opened.text + await _read(stream, _SHOWN_CHARS)
            revision = await push_directory(
                showcase.store_address,
                showcase.security,
                SWAP_ADAPTER,
                showcase.voices[second],
                description=f"the demo's {second} voice, pushed mid-stream",
            )
            states = await wait_until_routed(
                showcase.inference_address,
                showcase.security,
                {SWAP_ADAPTER: revision},
                showcase.routed_timeout_s,
            )
            after_push = await client.generate(SWAP_ADAPTER, PROMPT, _GREEDY, timeout=60.0)
            later = await _read(stream, _SHOWN_CHARS * 2)
        finally:
            # Cancels request 1 if it is still running: the demo has shown enough of it.
            await stream.aclose()  # type: ignore[attr-defined]
    old = f"{SWAP_ADAPTER}@{opened.revision}"
    say(f"  request 1 started on {old}: {one_line(before)}...")
    old_state = states.get((SWAP_ADAPTER, opened.revision), "removed")
    if old_state == "draining":
        say(
            f"  pushed {SWAP_ADAPTER}@{revision}; new requests go to it, while "
            f"{old} is draining: request 1 still runs on it"
        )
    elif old_state == "removed":
        # The engine made all of request 1 before the push landed (a fast machine): its
        # revision left the engine, and the stream goes on with what it made there.
        say(
            f"  pushed {SWAP_ADAPTER}@{revision}; new requests go to it. The engine had "
            f"made all of request 1 on {old} already, so {old} has left it"
        )
    else:
        say(f"  pushed {SWAP_ADAPTER}@{revision} ({old}: {old_state})")
    say(
        f"  request 2, sent after the push, got {SWAP_ADAPTER}@{after_push.revision}: "
        f"{one_line(after_push.text)}"
    )
    say(f"  request 1, still streaming from {old} after the push: ...{one_line(later)}...")


async def _read(stream: AsyncIterator[Delta], chars: int) -> str:
    """At least `chars` characters more of `stream`, or what is left of it."""
    text = ""
    async for delta in stream:
        text += delta.text
        if len(text) >= chars:
            break
    return text

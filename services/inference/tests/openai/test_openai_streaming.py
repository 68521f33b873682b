"""The OpenAI-compatible front's streamed answers and client disconnects on a fake engine.

The real engine's answers through this front are tested in tests/test_openai_front.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from collections.abc import AsyncGenerator, Mapping, Sequence

import httpx

from loraserve.inference.engine import AdapterHandle, EngineDelta, SamplingSpec
from loraserve.testing.abuse import closed_by_server
from loraserve.testing.fakes.engine import FAKE_INFO, FakeEngine
from loraserve.testing.inference.openai_front import MODEL, StartFront
from loraserve.testing.waiting import eventually


class StallingEngine(FakeEngine):
    """Sends one token, then never another: a stream that only a disconnect ends."""

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        self.running[request_id] = adapter
        try:
            yield EngineDelta(text="<0>", token_ids=(0,))
            await asyncio.Event().wait()
        finally:
            del self.running[request_id]
            self.aborted.append(request_id)


async def test_streamed_completion_sends_deltas_usage_and_done(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with httpx.AsyncClient(base_url=front.url) as http:
        response = await http.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": [1, 2],
                "max_tokens": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert '"text":"<0>"' in events[0]
    assert '"finish_reason":"length"' in events[1]
    assert '"choices":[]' in events[2]
    assert '"total_tokens":4' in events[2]


async def test_streamed_chat_opens_with_the_assistant_role(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with front.client() as client:
        stream = await client.chat.completions.create(
            model="alpha",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "<0><1>"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert {c.model for c in chunks} == {"alpha@3"}


async def test_several_prompts_stream_every_choice(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        stream = await client.completions.create(
            model="alpha", prompt=["a", "b"], max_tokens=2, stream=True
        )
        chunks = [chunk async for chunk in stream]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: "<0><1>", 1: "<0><1>"}


async def test_streamed_completion_carries_logprobs_per_chunk(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        stream = await client.completions.create(
            model="alpha", prompt="hi", max_tokens=2, logprobs=0, stream=True
        )
        chunks = [chunk async for chunk in stream]
    logprobs = [c.choices[0].logprobs for c in chunks if c.choices]
    assert [(lp.tokens, lp.token_logprobs, lp.text_offset) for lp in logprobs if lp] == [
        (["<0>"], [0.0], [0]),
        (["<1>"], [-0.1], [3]),
    ]


async def test_client_disconnect_mid_stream_aborts_the_engine_request(
    start_front: StartFront,
) -> None:
    engine = StallingEngine()
    front = await start_front(engine)
    async with front.client() as client:
        stream = await client.completions.create(
            model="alpha", prompt="x", max_tokens=4, stream=True
        )
        async for chunk in stream:
            assert chunk.choices[0].text == "<0>"
            break
        await stream.close()
    await eventually(lambda: bool(engine.aborted), "the request aborted")
    assert not engine.running


async def test_client_disconnect_before_a_non_streamed_answer_aborts_it(
    start_front: StartFront,
) -> None:
    engine = FakeEngine()
    engine.steps.clear()
    front = await start_front(engine)
    async with httpx.AsyncClient(base_url=front.url) as http:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        request = asyncio.create_task(http.post("/v1/completions", json=body))
        await eventually(lambda: bool(engine.running), "a request running")
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
    await eventually(lambda: bool(engine.aborted), "the request aborted")
    assert not engine.running


async def test_a_stream_its_client_never_reads_is_ended_and_its_engine_request_aborted(
    start_front: StartFront,
) -> None:
    engine = FakeEngine(dataclasses.replace(FAKE_INFO, max_model_len=1_000_000))
    engine.steps.set()
    front = await start_front(engine, stalled_write_s=0.5)
    # Far more events than the kernel's buffers hold (4 MiB at most on each side), to a
    # client that reads none of them: the server's sends wait on a full socket.
    body = json.dumps(
        {"model": MODEL, "prompt": [1, 2], "max_tokens": 500_000, "logprobs": 5, "stream": True}
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", front.server.port))
    try:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: loraserve\r\n"
            b"content-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await eventually(lambda: bool(engine.running), "the request running")
        await eventually(
            lambda: not engine.running and len(engine.aborted) == 1,
            "the stream ended and its engine request aborted",
        )
        # And the connection is dropped, not left waiting for the client to read.
        await eventually(lambda: closed_by_server(sock), "the connection dropped")
    finally:
        sock.close()


async def test_the_http_port_has_the_kernel_drop_peers_that_acknowledge_nothing(
    start_front: StartFront,
) -> None:
    # A response the client never reads outlives the app's clocks in the socket's buffer:
    # TCP_USER_TIMEOUT, inherited by every accepted connection, bounds that too.
    front = await start_front(stalled_write_s=0.5)
    timeout_ms = front.server.listening.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
    assert timeout_ms == 1000

"""The HTTP arms' OpenAI caller counts streamed tokens the way the servers send them, and
fails a request whose stream carries an error."""

from __future__ import annotations

import json


async def _stream_from_stub(
    events: list[dict[str, object]],
) -> tuple[list[object], dict[str, object]]:
    """Runs the HTTP arms' caller against a stub server that streams `events` as SSE;
    returns what the caller yielded (or the exception it raised) and the request body."""
    from aiohttp import web

    from bench.load.calls import http_session, openai_caller

    seen: list[dict[str, object]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    got: list[object] = []
    try:
        async with http_session() as http:
            call = openai_caller(http, f"http://127.0.0.1:{port}", "base")
            try:
                async for delta in call("", [3, 4], 3):
                    got.append(delta)
            except RuntimeError as exc:
                got.append(exc)
    finally:
        await runner.cleanup()
    return got, seen[0]


async def test_openai_caller_counts_streamed_token_ids() -> None:
    """The HTTP arms count tokens from `return_token_ids` in each SSE chunk, the way vLLM
    and loraserve's front send them (a stub server replays that shape)."""
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "text": "x", "token_ids": ids}]} for ids in ([5], [], [6, 7])
    ]
    deltas, body = await _stream_from_stub(events)
    assert deltas == [(1, 0), (2, 0)]
    sent = {key: body[key] for key in ("model", "prompt", "stream", "return_token_ids")}
    assert sent == {"model": "base", "prompt": [3, 4], "stream": True, "return_token_ids": True}


async def test_openai_caller_fails_the_request_on_an_error_inside_the_stream() -> None:
    """A server that fails mid-stream answers 200 and sends an error event: the request
    is a failure, not a short success."""
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "text": "x", "token_ids": [5]}]},
        {"error": {"message": "engine died", "code": 500}},
    ]
    got, _ = await _stream_from_stub(events)
    assert got[0] == (1, 0)
    assert isinstance(got[1], RuntimeError)
    assert "engine died" in str(got[1])

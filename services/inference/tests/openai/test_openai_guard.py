"""The OpenAI front refuses a request without a token, or with a body over the limit,
before reading the body, over real HTTP on 127.0.0.1.

Each test sends the request line, the headers and only part of the body on a raw
socket, then waits for the answer: a server that read the whole body first would
never answer, so the test shows the refusal came before the body without timing it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loraserve.common.rpc.security import ServerSecurity, Token
from loraserve.inference.adapters import LLAMA_TARGET_MODULES, AdapterRegistry, CompatibilityChecker
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.openai import RunningHttpServer, create_openai_app, start_http_server
from loraserve.inference.serving import Admission, Generator, Runtime, RuntimeRef
from loraserve.testing.fakes.engine import CacheDirectory, FakeEngine, make_revision
from loraserve.testing.waiting import GUARD_S

MODEL = "fake-llama"
READER = "reader-secret"
LIMIT = 1024 * 1024
# Far more than the server would ever need to see: it must answer without it.
DECLARED = 200 * 1024 * 1024
SENT = 256 * 1024


@pytest.fixture
async def front_port(tmp_path: Path) -> AsyncIterator[int]:
    """The OpenAI front on a fake engine, with a reader token and a 1 MiB body limit."""
    engine = FakeEngine()
    compat = CompatibilityChecker(
        max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name=MODEL
    )
    registry = AdapterRegistry(engine, CacheDirectory(tmp_path), compat)
    await registry.install(make_revision(tmp_path, "alpha", 3).manifest, make_current=True)
    admission = Admission(4)
    runtime_ref = RuntimeRef()
    runtime_ref.set(
        Runtime(
            engine,
            registry,
            Generator(engine, registry, admission, InferenceMetrics()),
            admission,
            replica_id="r",
        )
    )
    app = create_openai_app(
        runtime_ref,
        model_names=[MODEL],
        security=ServerSecurity(reader_tokens=(Token("client", READER),)),
        is_ready=lambda: True,
        max_body_bytes=LIMIT,
    )
    server: RunningHttpServer = await start_http_server(
        app, address="127.0.0.1:0", security=ServerSecurity()
    )
    try:
        yield server.port
    finally:
        await server.stop(grace=None)


def _head(*headers: str) -> bytes:
    lines = ["POST /v1/completions HTTP/1.1", "host: 127.0.0.1", "content-type: application/json"]
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode()


async def _answer_before_the_body_ends(port: int, head: bytes, sent: bytes) -> tuple[int, Any]:
    """Sends `head` and part of a body, never the rest; the response's status and JSON."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + sent)
        await writer.drain()
        async with asyncio.timeout(GUARD_S):
            status_line = await reader.readline()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
    finally:
        writer.close()
    return int(status_line.split()[1]), json.loads(body)


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_request_without_a_token_gets_401_before_its_body_is_read(
    front_port: int,
) -> None:
    status, body = await _answer_before_the_body_ends(
        front_port, _head(f"content-length: {DECLARED}"), b"x" * SENT
    )
    assert status == 401
    assert body["error"]["message"] == "missing 'authorization: Bearer <token>' header"


async def test_wrong_token_gets_401_before_a_chunked_body_is_read(front_port: int) -> None:
    status, body = await _answer_before_the_body_ends(
        front_port,
        _head("authorization: Bearer guess", "transfer-encoding: chunked"),
        _chunked(b"x" * SENT),
    )
    assert (status, body["error"]["message"]) == (401, "invalid bearer token")


async def test_declared_body_over_the_limit_gets_413_unread(front_port: int) -> None:
    status, body = await _answer_before_the_body_ends(
        front_port,
        _head(f"authorization: Bearer {READER}", f"content-length: {DECLARED}"),
        b"x" * SENT,
    )
    assert status == 413
    assert body["error"]["message"] == (
        f"request body of {DECLARED} bytes is over the limit of {LIMIT} bytes "
        "(--openai-max-body-size)"
    )


async def test_chunked_body_growing_past_the_limit_gets_413_without_the_rest(
    front_port: int,
) -> None:
    past_the_limit = b"".join(_chunked(b"x" * (LIMIT // 4)) for _ in range(5))
    status, body = await _answer_before_the_body_ends(
        front_port,
        _head(f"authorization: Bearer {READER}", "transfer-encoding: chunked"),
        past_the_limit,
    )
    assert status == 413
    assert body["error"]["message"] == (
        f"request body is over the limit of {LIMIT} bytes (--openai-max-body-size)"
    )


async def test_chunked_body_within_the_limit_is_served(front_port: int) -> None:
    request = json.dumps({"model": "alpha", "prompt": "hi", "max_tokens": 2}).encode()
    half = len(request) // 2
    status, body = await _answer_before_the_body_ends(
        front_port,
        _head(f"authorization: Bearer {READER}", "transfer-encoding: chunked"),
        _chunked(request[:half]) + _chunked(request[half:]) + b"0\r\n\r\n",
    )
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 2

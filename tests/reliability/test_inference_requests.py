"""Rows 7 and 8: bad Generate requests, and clients that cancel or run out of time
at every point of a stream, against the whole inference server on the real engine.

Each bad request ends with its status code and leaves the engine serving; every
cancel or deadline aborts the engine request, so nothing stays running: the engine
(by vLLM's own counters) generated fewer tokens than the request asked for and never
finished it, which a request left to run to its end cannot fake. A deadline over
before the first token leaves the engine no work at all; one that passes mid-stream
(tokens received first) aborts a request the engine was generating for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.work import EngineWork, engine_work
from loraserve.testing.inference.app import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import GUARD_S, eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

MAX_MODEL_LEN = 512  # the session engine's
# Tokens a cancelled request asks for: far more than the engine makes before any cancel
# here reaches it, so vLLM's own count tells an aborted request (fewer tokens, never
# finished) from one left to run (all of them, finished).
LONG = 450


@asynccontextmanager
async def _serving_alpha(
    engine: AsyncLLM,
    model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store: RunningStore,
    cache_dir: Path,
) -> AsyncIterator[RunningInference]:
    async with inference_app(
        engine,
        model_dir=model_dir,
        store_address=store.address,
        cache_dir=cache_dir,
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
    ) as running:
        yield running


@pytest.fixture
async def served(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[RunningInference]:
    """An inference server synced with a store that holds adapter `alpha` (revision 1),
    for tests that count what happened on it."""
    async with _serving_alpha(
        vllm_engine, tiny_model_dir, tiny_adapter, store_server, tmp_path / "cache"
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def served_to_bad_requests(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    module_store_server: RunningStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[RunningInference]:
    """The same server, shared by the bad requests: each test checks that its request
    left the server serving and the engine empty, which is what lets the next one share
    it."""
    cache_dir = tmp_path_factory.mktemp("bad-requests") / "cache"
    async with _serving_alpha(
        vllm_engine, tiny_model_dir, tiny_adapter, module_store_server, cache_dir
    ) as running:
        yield running


async def _idle(served: RunningInference) -> int:
    """What the engine holds once every aborted request has left it (0), or what it
    still holds when the guard runs out."""
    try:
        async with asyncio.timeout(GUARD_S):
            while True:
                if await served.in_engine() == 0:
                    return 0
                await asyncio.sleep(0.02)
    except TimeoutError:
        return await served.in_engine()


async def _code(served: RunningInference, request: pb.GenerateRequest, **kwargs: Any) -> Any:
    try:
        async for _ in served.stub.Generate(request, **kwargs):
            pass
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _text(text: str, max_tokens: int = 4, adapter: str = "alpha") -> pb.GenerateRequest:
    return pb.GenerateRequest(
        adapter=adapter,
        text=text,
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def _sampling(**fields: Any) -> pb.GenerateRequest:
    request = greedy("alpha", 4)
    for name, value in fields.items():
        if name == "stop":
            request.sampling.stop.extend(value)
        else:
            setattr(request.sampling, name, value)
    return request


BAD_REQUESTS: dict[str, tuple[pb.GenerateRequest, grpc.StatusCode]] = {
    "unknown-adapter": (greedy("nobody", 4), grpc.StatusCode.NOT_FOUND),
    # Under the default pin policy a revision that is neither current nor a candidate is
    # refused before anyone asks the store whether it exists.
    "revision-outside-the-pin-policy": (
        greedy("alpha@99", 4),
        grpc.StatusCode.FAILED_PRECONDITION,
    ),
    "revision-zero": (greedy("alpha@0", 4), grpc.StatusCode.INVALID_ARGUMENT),
    "revision-not-a-number": (greedy("alpha@one", 4), grpc.StatusCode.INVALID_ARGUMENT),
    "path-as-adapter": (greedy("../alpha", 4), grpc.StatusCode.INVALID_ARGUMENT),
    "unicode-adapter": (greedy("\u0430lpha", 4), grpc.StatusCode.INVALID_ARGUMENT),
    "temperature-negative": (_sampling(temperature=-1.0), grpc.StatusCode.INVALID_ARGUMENT),
    "temperature-nan": (_sampling(temperature=float("nan")), grpc.StatusCode.INVALID_ARGUMENT),
    "top-p-zero": (_sampling(top_p=0.0), grpc.StatusCode.INVALID_ARGUMENT),
    "top-p-above-one": (_sampling(top_p=1.5), grpc.StatusCode.INVALID_ARGUMENT),
    "top-k-below-minus-one": (_sampling(top_k=-2), grpc.StatusCode.INVALID_ARGUMENT),
    "too-many-stops": (_sampling(stop=["x"] * 17), grpc.StatusCode.INVALID_ARGUMENT),
    "empty-stop": (_sampling(stop=[""]), grpc.StatusCode.INVALID_ARGUMENT),
    "max-tokens-zero": (_sampling(max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT),
    "max-tokens-negative": (_sampling(max_tokens=-5), grpc.StatusCode.INVALID_ARGUMENT),
    "prompt-empty": (pb.GenerateRequest(adapter="alpha"), grpc.StatusCode.INVALID_ARGUMENT),
    "prompt-token-negative": (
        greedy("alpha", 4, prompt=(1, -3)),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "prompt-token-beyond-vocab": (
        greedy("alpha", 4, prompt=(1, 10**6)),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "prompt-longer-than-max-model-len": (
        greedy("alpha", 4, prompt=[7] * (MAX_MODEL_LEN + 1)),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "text-prompt-longer-than-max-model-len": (
        _text("lorem ipsum " * 20_000),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "message-over-the-grpc-limit": (
        _text("x" * (17 * 1024 * 1024)),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ),
    "request-id-too-long": (
        pb.GenerateRequest(
            adapter="alpha", token_ids=pb.TokenIds(ids=[1, 2]), request_id="r" * 129
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS, ids=list(BAD_REQUESTS))
async def test_bad_request_gets_its_status_and_the_engine_keeps_serving(
    case: str, served_to_bad_requests: RunningInference, pytestconfig: pytest.Config
) -> None:
    served = served_to_bad_requests
    request, expected = BAD_REQUESTS[case]
    add_figure(pytestconfig, "bad_inputs.generate_requests")
    assert await _code(served, request) == expected
    revision, tokens = await served.generate("alpha", 4)
    assert (revision, len(tokens)) == (1, 4)
    assert await _idle(served) == 0


async def _cancel_after(served: RunningInference, tokens: int) -> None:
    # Counted in tokens, not messages: under load vLLM merges the chunks a lagging reader
    # has not taken, so a stream may come in fewer messages than it has tokens.
    call = served.stub.Generate(greedy("alpha", LONG))
    received = 0
    async for message in call:
        received += len(message.token_ids)
        if received >= tokens:
            break
    call.cancel()


async def _work_once_idle(served: RunningInference, before: EngineWork) -> EngineWork:
    """What the engine did since `before`, read once it holds no request."""
    assert await _idle(served) == 0
    return engine_work() - before


def _cancelled(served: RunningInference) -> float:
    labels = {"adapter": "alpha", "code": "CANCELLED"}
    registry = served.app.metrics.registry
    return registry.get_sample_value("loraserve_inference_requests_total", labels) or 0.0


@pytest.mark.parametrize("tokens", [1, 2, 50, 199], ids=lambda n: f"after-{n}-tokens")
async def test_client_cancel_mid_stream_aborts_the_engine_request(
    tokens: int, served: RunningInference, pytestconfig: pytest.Config
) -> None:
    before = engine_work()
    await _cancel_after(served, tokens)
    add_figure(pytestconfig, "faults.client_cancels")
    work = await _work_once_idle(served, before)

    assert work.finished_requests == 0
    assert tokens <= work.generated_tokens < LONG
    await eventually(lambda: _cancelled(served) == 1, "the request counted as CANCELLED")
    assert [s.in_flight for s in (await served.statuses("alpha")).values()] == [0]


async def test_client_cancel_before_the_first_message_aborts_the_engine_request(
    served: RunningInference, pytestconfig: pytest.Config
) -> None:
    before = engine_work()
    call = served.stub.Generate(greedy("alpha", LONG))
    await call.initial_metadata()
    call.cancel()
    add_figure(pytestconfig, "faults.client_cancels")
    work = await _work_once_idle(served, before)

    assert work.finished_requests == 0
    assert work.generated_tokens < LONG
    await eventually(lambda: _cancelled(served) == 1, "the request counted as CANCELLED")


async def test_client_cancel_right_after_sending_aborts_the_engine_request(
    served: RunningInference, pytestconfig: pytest.Config
) -> None:
    before = engine_work()
    call = served.stub.Generate(greedy("alpha", LONG))
    await asyncio.sleep(0)
    call.cancel()
    add_figure(pytestconfig, "faults.client_cancels")
    # The cancel may reach the server before the request does: then the engine never
    # had it, which counts the same.
    work = await _work_once_idle(served, before)

    assert work.finished_requests == 0
    assert work.generated_tokens < LONG


async def _past_deadline(served: RunningInference, deadline_s: float) -> tuple[Any, int]:
    """The status a long generation with `deadline_s` ends with, and the tokens its
    client received first: any at all, and the engine had the request."""
    received = 0
    call = served.stub.Generate(greedy("alpha", LONG, prompt=[7] * 8), timeout=deadline_s)
    try:
        async for message in call:
            received += len(message.token_ids)
    except grpc.aio.AioRpcError as e:
        return e.code(), received
    return grpc.StatusCode.OK, received


async def test_deadline_over_before_the_first_token_ends_deadline_exceeded_with_no_engine_work(
    served: RunningInference, pytestconfig: pytest.Config
) -> None:
    before = engine_work()
    # 1 ms: over before any engine step could make a token, whether the call had reached
    # the server by then or not (it varies with the load).
    code, received = await _past_deadline(served, 0.001)
    add_figure(pytestconfig, "faults.client_deadlines")
    work = await _work_once_idle(served, before)

    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert received == 0
    assert work == EngineWork(generated_tokens=0, finished_requests=0)


@pytest.mark.parametrize("deadline_s", [0.05, 0.3, 1.0])
async def test_deadline_mid_stream_ends_deadline_exceeded_and_aborts_the_engine_request(
    deadline_s: float, served: RunningInference, pytestconfig: pytest.Config
) -> None:
    before = engine_work()
    code, received = await _past_deadline(served, deadline_s)
    add_figure(pytestconfig, "faults.client_deadlines")
    work = await _work_once_idle(served, before)

    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    # Tokens streamed before the deadline: the engine was generating for the request
    # when it passed, so what follows is that engine request's abort.
    assert received > 0
    assert work.finished_requests == 0
    assert received <= work.generated_tokens < LONG
    await eventually(lambda: _cancelled(served) == 1, "the call counted as CANCELLED")


async def test_many_clients_cancelling_at_once_leave_nothing_running(
    served: RunningInference, pytestconfig: pytest.Config
) -> None:
    before = engine_work()
    await asyncio.gather(*(_cancel_after(served, 1 + i % 7) for i in range(32)))
    add_figure(pytestconfig, "faults.client_cancels", 32)
    work = await _work_once_idle(served, before)

    assert work.finished_requests == 0
    await eventually(lambda: _cancelled(served) == 32, "every request counted as CANCELLED")
    revision, tokens = await served.generate("alpha", 4)
    assert (revision, len(tokens)) == (1, 4)

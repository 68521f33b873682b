"""vLLM's own spans join a request's trace only where vLLM traces (its
`otlp_traces_endpoint` engine argument): `VllmEngine` then hands vLLM the request's
trace headers, on the pulled and the pushed path alike, and otherwise none (vLLM would
warn of them and drop them). On the session's engine, seen through a wrapper that says
whether vLLM's tracing is on and records the headers vLLM is given (they go no further:
the session's engine has no tracer of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from loraserve.inference.engine import EngineFinish, SamplingRequest, VllmEngine
from loraserve.inference.engine import pushed_outputs_supported as pushed_supported

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

HEADERS = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
PROMPT = (5, 17, 42, 99)
VLLM_ENDPOINT = "http://127.0.0.1:4317"


class _Llm:
    """The session's AsyncLLM with vLLM's tracing `endpoint` as given; records the
    `trace_headers` each request is added with."""

    def __init__(self, llm: AsyncLLM, endpoint: str | None) -> None:
        self._llm = llm
        self.observability_config = SimpleNamespace(otlp_traces_endpoint=endpoint)
        self.headers: list[Mapping[str, str] | None] = []

    def generate(self, *args: Any, trace_headers: Any = None, **kwargs: Any) -> Any:
        self.headers.append(trace_headers)
        return self._llm.generate(*args, **kwargs)

    async def add_request(self, *args: Any, trace_headers: Any = None, **kwargs: Any) -> Any:
        self.headers.append(trace_headers)
        return await self._llm.add_request(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


class _Sink:
    def __init__(self) -> None:
        self.done = asyncio.get_running_loop().create_future()

    def delta(
        self, text: str, token_ids: Sequence[int], finish: EngineFinish | None, finished: bool
    ) -> None:
        if finished and not self.done.done():
            self.done.set_result(None)

    def fail(self, error: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(error)


def _engine(llm: AsyncLLM, endpoint: str | None) -> tuple[VllmEngine, _Llm]:
    wrapped = _Llm(llm, endpoint)
    return VllmEngine(wrapped), wrapped


async def _pull(engine: VllmEngine, request_id: str) -> None:
    spec = engine.sampling(SamplingRequest(max_tokens=2, temperature=0.0), len(PROMPT))
    async for _ in engine.generate(request_id, PROMPT, spec, None, trace_headers=HEADERS):
        pass


async def _push(engine: VllmEngine, request_id: str) -> None:
    spec = engine.sampling(SamplingRequest(max_tokens=2, temperature=0.0), len(PROMPT))
    sink = _Sink()
    await engine.push(request_id, PROMPT, spec, None, sink, trace_headers=HEADERS)
    await sink.done


async def test_vllm_gets_a_pulled_requests_trace_headers_where_it_traces(
    vllm_engine: AsyncLLM,
) -> None:
    engine, llm = _engine(vllm_engine, VLLM_ENDPOINT)
    await _pull(engine, "traced-pull")
    assert llm.headers == [HEADERS]


async def test_vllm_gets_no_trace_headers_where_it_does_not_trace(vllm_engine: AsyncLLM) -> None:
    engine, llm = _engine(vllm_engine, None)
    await _pull(engine, "untraced-pull")
    assert llm.headers == [None]


@pytest.mark.skipif(not pushed_supported(), reason="this vLLM cannot push outputs")
async def test_vllm_gets_a_pushed_requests_trace_headers_where_it_traces(
    vllm_engine: AsyncLLM,
) -> None:
    engine, llm = _engine(vllm_engine, VLLM_ENDPOINT)
    await _push(engine, "traced-push")
    assert llm.headers == [HEADERS]

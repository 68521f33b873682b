"""Pushed outputs: `VllmOutputSink` reads vLLM's own output objects as the pull path does
(`VllmEngine.generate`), and a pushed Generate stream (serving/pushed.py) does per engine
step what the pull loop does per delta. And the installed vLLM keeps a request's
collector where the engine puts the sink (engine/pushed.py), so that a vLLM upgrade that
moves it fails here rather than serving pulled unnoticed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError

from loraserve.common.errors import InvalidArgument, Unavailable
from loraserve.inference.adapters import Lease
from loraserve.inference.engine import EngineFinish, SamplingSpec, pushed_outputs_supported
from loraserve.inference.engine.pushed import VllmOutputSink
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving import (
    ChunkWriter,
    FinishReason,
    GenerationChunk,
    PushedStream,
    Usage,
    pushable,
)
from loraserve.inference.serving.chunks import Outcome

Delta = tuple[str, tuple[int, ...], EngineFinish | None, bool]


class _Recorder:
    """A DeltaSink that records what it is given."""

    def __init__(self) -> None:
        self.deltas: list[Delta] = []
        self.errors: list[Exception] = []

    def delta(
        self, text: str, token_ids: Sequence[int], finish: EngineFinish | None, finished: bool
    ) -> None:
        self.deltas.append((text, tuple(token_ids), finish, finished))

    def fail(self, error: Exception) -> None:
        self.errors.append(error)


def _output(text: str, tokens: Sequence[int], finish: str | None = None) -> Any:
    """vLLM's RequestOutput in delta mode, as far as the sink reads it."""
    completion = SimpleNamespace(text=text, token_ids=list(tokens), finish_reason=finish)
    return SimpleNamespace(outputs=[completion], finished=finish is not None)


def _vllm_sink(params: Any = None) -> tuple[VllmOutputSink, _Recorder]:
    recorder = _Recorder()
    return VllmOutputSink(recorder, "req-1", params or SamplingParams(max_tokens=8)), recorder


def test_the_installed_vllm_keeps_a_requests_collector_where_pushed_outputs_go() -> None:
    assert pushed_outputs_supported()


def test_vllm_outputs_become_deltas_with_the_engines_finish() -> None:
    sink, recorder = _vllm_sink()
    sink.put(_output("a", [1, 2]))
    sink.put(_output("b", [3], "stop"))
    sink.put(_output("", [], "repetition"))
    assert recorder.deltas == [
        ("a", (1, 2), None, False),
        ("b", (3,), EngineFinish.STOP, True),
        ("", (), None, True),
    ]


def test_vllms_error_finish_is_a_retryable_failure_of_the_request() -> None:
    sink, recorder = _vllm_sink()
    sink.put(_output("", [], "error"))
    (error,) = recorder.errors
    assert isinstance(error, Unavailable)


def test_vllms_error_finish_under_a_structured_output_is_the_requests_fault() -> None:
    params = SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(regex="a"))
    sink, recorder = _vllm_sink(params)
    sink.put(_output("", [], "error"))
    (error,) = recorder.errors
    assert isinstance(error, InvalidArgument)


def test_a_dead_engine_ends_a_pushed_request_unavailable() -> None:
    sink, recorder = _vllm_sink()
    sink.put(EngineDeadError())
    (error,) = recorder.errors
    assert isinstance(error, Unavailable)
    assert "engine has stopped" in error.message


def _stream(
    written: list[GenerationChunk], outcome: Outcome | None = None, write: ChunkWriter | None = None
) -> PushedStream:
    return PushedStream(
        write or written.append,
        "req-1",
        5,
        Lease("alpha", 3, None),
        0.0,
        outcome or Outcome(),
        InferenceMetrics(),
    )


async def test_a_pushed_stream_names_what_serves_it_first_and_ends_with_usage() -> None:
    written: list[GenerationChunk] = []
    charged: list[int] = []
    outcome = Outcome(charge=charged.append)
    stream = _stream(written, outcome)
    stream.delta("a", [1, 2], None, False)
    stream.delta("b", [3], None, False)
    stream.delta("c", [4], EngineFinish.LENGTH, True)
    await asyncio.wait_for(stream.done, 1)
    assert written == [
        GenerationChunk("a", [1, 2], adapter_name="alpha", revision=3, request_id="req-1"),
        GenerationChunk("b", [3]),
        GenerationChunk("c", [4], finish_reason=FinishReason.LENGTH, usage=Usage(5, 4)),
    ]
    assert charged == [2, 1, 1]
    assert outcome.ttft_s is not None
    assert stream.finish is FinishReason.LENGTH


@pytest.mark.parametrize(
    ("finish", "message"),
    [(EngineFinish.ABORT, "aborted request req-1"), (None, "without a finish reason")],
    ids=["abort", "unknown-finish"],
)
async def test_a_pushed_stream_ends_unavailable_as_the_pull_path_does(
    finish: EngineFinish | None, message: str
) -> None:
    stream = _stream([])
    stream.delta("a", [1], None, False)
    stream.delta("", [], finish, True)
    with pytest.raises(Unavailable, match=message):
        await asyncio.wait_for(stream.done, 1)
    assert stream.finish is None
    assert stream.generated == 1


async def test_a_failing_writer_ends_its_own_stream_and_nothing_else() -> None:
    def failing(chunk: GenerationChunk) -> None:
        raise RuntimeError("a bug in the writer")

    stream = _stream([], write=failing)
    stream.delta("a", [1], None, False)
    stream.delta("b", [2], EngineFinish.STOP, True)
    with pytest.raises(RuntimeError, match="a bug in the writer"):
        await asyncio.wait_for(stream.done, 1)


async def test_a_pushed_stream_ends_with_the_first_error_and_ignores_what_follows() -> None:
    written: list[GenerationChunk] = []
    stream = _stream(written)
    stream.fail(InvalidArgument("refused"))
    stream.delta("late", [1], EngineFinish.STOP, True)
    stream.fail(Unavailable("later"))
    with pytest.raises(InvalidArgument, match="refused"):
        await asyncio.wait_for(stream.done, 1)
    assert written == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (SamplingSpec(max_tokens=4, params=SamplingParams(max_tokens=4)), True),
        (SamplingSpec(max_tokens=4, n=2, params=SamplingParams(max_tokens=4, n=2)), False),
        (SamplingSpec(max_tokens=4, params=SamplingParams(max_tokens=4, logprobs=1)), False),
        (
            SamplingSpec(max_tokens=4, params=SamplingParams(max_tokens=4, prompt_logprobs=0)),
            False,
        ),
    ],
    ids=["plain", "n", "logprobs", "prompt-logprobs"],
)
def test_only_a_plain_request_is_pushed(spec: SamplingSpec, expected: bool) -> None:
    assert pushable(spec) is expected


def test_an_output_the_sink_cannot_read_ends_its_request_not_the_output_handler() -> None:
    sink, recorder = _vllm_sink()
    sink.put(SimpleNamespace(outputs=[], finished=False))
    (error,) = recorder.errors
    assert isinstance(error, IndexError)

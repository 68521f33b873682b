"""A Generate's span as the generator records it, on a fake engine with its spans sent to
an in-process OTLP receiver: the engine gets the span's context, an unrecorded request
gives it none, a generator without an endpoint starts no span, a refused request is the
caller's error (status left unset), the engine's fault is the server's (status ERROR),
and the span names the arm that served it (current, pinned, a rollout's candidate)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from loraserve.clients.store import RolloutSplit
from loraserve.common.errors import ResourceExhausted, Unavailable
from loraserve.common.tracing import TracingSettings
from loraserve.inference.adapters import LLAMA_TARGET_MODULES, AdapterRegistry, CompatibilityChecker
from loraserve.inference.engine import AdapterHandle, EngineDelta, EngineFinish, SamplingSpec
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving import Admission
from loraserve.inference.serving.generation import GenerateCommand, Generator, SamplingRequest
from loraserve.testing.fakes.engine import CacheDirectory, FakeEngine, make_revision
from loraserve.testing.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from loraserve.testing.tracing import exporting_spans

# Tracing on, as `--otlp-traces-endpoint` turns it on; spans go where `exporting_spans` says.
TRACED = TracingSettings(endpoint="http://collector:4317")
COMMAND = GenerateCommand(adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=2))


class _RecordingEngine(FakeEngine):
    """Records the trace headers each generation is given."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[Mapping[str, str] | None] = []

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        self.headers.append(trace_headers)
        return super().generate(request_id, prompt_token_ids, sampling, adapter)


def _compat() -> CompatibilityChecker:
    return CompatibilityChecker(
        max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name="fake-llama"
    )


@pytest.fixture
def engine() -> _RecordingEngine:
    return _RecordingEngine()


@pytest.fixture
async def registry_of(engine: _RecordingEngine, tmp_path: Path) -> AdapterRegistry:
    registry = AdapterRegistry(engine, CacheDirectory(tmp_path), _compat())
    await registry.install(make_revision(tmp_path, "alpha", 3).manifest, make_current=True)
    return registry


@pytest.fixture
def generator(engine: _RecordingEngine, registry_of: AdapterRegistry) -> Generator:
    return Generator(engine, registry_of, Admission(1), InferenceMetrics(), tracing=TRACED)


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with otlp_receiver() as running, exporting_spans(running.endpoint):
        yield running


async def _run(generator: Generator, command: GenerateCommand = COMMAND) -> None:
    async for _ in generator.generate(command):
        pass


async def _generate_span(receiver: OtlpReceiver) -> ReceivedSpan:
    (span,) = await receiver.wait_for("loraserve.generate")
    return span


async def test_the_engine_gets_the_context_of_the_generates_span(
    generator: Generator, engine: _RecordingEngine, receiver: OtlpReceiver
) -> None:
    await _run(generator)

    span = await _generate_span(receiver)
    (headers,) = engine.headers
    assert headers is not None
    assert headers["traceparent"].split("-")[1:3] == [span.trace_id, span.span_id]


async def test_an_unrecorded_generate_gives_the_engine_no_trace_headers(
    generator: Generator, engine: _RecordingEngine
) -> None:
    await _run(generator)
    assert engine.headers == [None]


async def test_a_generator_without_an_endpoint_starts_no_span(
    generator: Generator,
    registry_of: AdapterRegistry,
    engine: _RecordingEngine,
    receiver: OtlpReceiver,
) -> None:
    untraced = Generator(engine, registry_of, Admission(1), InferenceMetrics())
    await _run(untraced)
    await _run(generator)

    await receiver.wait_for("loraserve.generate")
    assert len(receiver.spans("loraserve.generate")) == 1
    assert engine.headers[0] is None


async def test_a_refused_generate_is_the_callers_error_on_its_span(
    generator: Generator, receiver: OtlpReceiver
) -> None:
    holding = generator.generate(COMMAND)
    async with contextlib.aclosing(holding):
        await anext(holding)  # holds the only place
        with pytest.raises(ResourceExhausted):
            await _run(generator)

    spans = await receiver.wait_for("loraserve.generate", 2)
    (refused,) = [s for s in spans if s.attributes["loraserve.code"] == "RESOURCE_EXHAUSTED"]
    assert refused.attributes["loraserve.admitted"] is False
    assert refused.span.status.code == Status.STATUS_CODE_UNSET
    assert [event.name for event in refused.span.events] == ["exception"]


async def test_an_engine_abort_is_the_servers_error_on_its_span(
    generator: Generator, engine: _RecordingEngine, receiver: OtlpReceiver
) -> None:
    engine.finish_with = EngineFinish.ABORT
    with pytest.raises(Unavailable):
        await _run(generator)

    span = await _generate_span(receiver)
    assert span.attributes["loraserve.code"] == "UNAVAILABLE"
    assert span.span.status.code == Status.STATUS_CODE_ERROR


@pytest.mark.parametrize(
    ("adapter", "weight", "arm", "revision"),
    [
        ("alpha", 0.0, "current", 3),
        ("alpha@3", 100.0, "pinned", 3),
        ("alpha", 100.0, "candidate", 4),
    ],
)
async def test_a_generates_span_names_the_arm_that_served_it(
    generator: Generator,
    registry_of: AdapterRegistry,
    receiver: OtlpReceiver,
    tmp_path: Path,
    adapter: str,
    weight: float,
    arm: str,
    revision: int,
) -> None:
    candidate = make_revision(tmp_path, "alpha", 4).manifest
    registry_of.set_rollout("alpha", RolloutSplit(candidate, weight, start_seq=9))
    await _run(generator, dataclasses.replace(COMMAND, adapter=adapter))

    span = await _generate_span(receiver)
    assert span.attributes["loraserve.rollout.arm"] == arm
    assert span.attributes["loraserve.revision"] == revision

"""Generate's rules on a fake engine: validation, streaming shape, cancellation, admission."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Literal

import pytest

from loraserve.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from loraserve.inference.adapters import LLAMA_TARGET_MODULES, AdapterRegistry, CompatibilityChecker
from loraserve.inference.engine import EngineFinish, StructuredOutput
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving import Admission
from loraserve.inference.serving.admission_rates import RATE_GRID_S, AdmissionRates
from loraserve.inference.serving.generation import (
    FinishReason,
    GenerateCommand,
    GenerationChunk,
    Generator,
    SamplingRequest,
    Usage,
)
from loraserve.testing.fakes.clock import ManualClock
from loraserve.testing.fakes.engine import CacheDirectory, FakeEngine, make_revision
from loraserve.testing.waiting import eventually


class _Steps(asyncio.Event):
    """The fake engine's step gate, counting the generations waiting at it: cleared, a
    count of one says the stream waits on the engine's next step."""

    def __init__(self) -> None:
        super().__init__()
        self.set()
        self.waiting = 0

    async def wait(self) -> Literal[True]:
        self.waiting += 1
        try:
            return await super().wait()
        finally:
            self.waiting -= 1


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine()
    engine.steps = _Steps()
    return engine


def _waiting_on_a_step(engine: FakeEngine) -> bool:
    assert isinstance(engine.steps, _Steps)
    return engine.steps.waiting == 1


@pytest.fixture
async def registry(engine: FakeEngine, tmp_path: Path) -> AdapterRegistry:
    compat = CompatibilityChecker(
        max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name="fake-llama"
    )
    registry = AdapterRegistry(engine, CacheDirectory(tmp_path), compat)
    await registry.install(make_revision(tmp_path, "alpha", 3).manifest, make_current=True)
    return registry


@pytest.fixture
def metrics() -> InferenceMetrics:
    return InferenceMetrics()


def _generator(
    engine: FakeEngine, registry: AdapterRegistry, metrics: InferenceMetrics, max_pending: int = 4
) -> Generator:
    return Generator(engine, registry, Admission(max_pending), metrics)


@pytest.fixture
def generator(
    engine: FakeEngine, registry: AdapterRegistry, metrics: InferenceMetrics
) -> Generator:
    return _generator(engine, registry, metrics)


async def _collect(generator: Generator, command: GenerateCommand) -> list[GenerationChunk]:
    return [chunk async for chunk in generator.generate(command)]


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        (SamplingRequest(max_tokens=0), "sampling.max_tokens"),
        (SamplingRequest(temperature=2.5), "sampling.temperature"),
        (SamplingRequest(temperature=float("nan")), "sampling.temperature"),
        (SamplingRequest(top_p=0.0), "sampling.top_p"),
        (SamplingRequest(top_p=1.5), "sampling.top_p"),
        (SamplingRequest(top_k=-2), "top_k"),
        (SamplingRequest(min_p=2.0), "min_p"),
        (SamplingRequest(presence_penalty=3.0), "presence_penalty"),
        (SamplingRequest(repetition_penalty=0.0), "repetition_penalty"),
        (SamplingRequest(min_tokens=-1), "min_tokens"),
        (SamplingRequest(n=0), "n"),
        (SamplingRequest(logprobs=-2), "logprobs"),
        (SamplingRequest(structured_output=StructuredOutput()), "structured_output"),
        (
            SamplingRequest(structured_output=StructuredOutput(regex="a", grammar="b")),
            "structured_output",
        ),
        (SamplingRequest(stop=("x",) * 17), "sampling.stop"),
        (SamplingRequest(stop=("",)), r"sampling.stop\[0\]"),
        (SamplingRequest(stop=("y" * 257,)), r"sampling.stop\[0\]"),
    ],
)
async def test_bad_sampling_is_invalid_argument_naming_the_field(
    generator: Generator, sampling: SamplingRequest, field: str
) -> None:
    command = GenerateCommand(adapter="alpha", prompt_text="hello", sampling=sampling)
    with pytest.raises(InvalidArgument, match=field):
        await _collect(generator, command)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (GenerateCommand(adapter="alpha"), "prompt is empty"),
        (GenerateCommand(adapter="alpha", prompt_text=""), "prompt is empty"),
        (GenerateCommand(adapter="alpha", prompt_token_ids=()), "prompt is empty"),
        (GenerateCommand(adapter="alpha", prompt_token_ids=(1, 100)), r"token_ids\[1\]"),
        (GenerateCommand(adapter="alpha", prompt_token_ids=(-1,)), r"token_ids\[0\]"),
        (GenerateCommand(adapter="Bad/Name", prompt_text="x"), "invalid adapter name"),
        (GenerateCommand(adapter="alpha@0", prompt_text="x"), "revision"),
        (GenerateCommand(adapter="alpha", prompt_text="x", request_id="a\nb"), "request_id"),
    ],
)
async def test_bad_request_is_invalid_argument(
    generator: Generator, command: GenerateCommand, message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        await _collect(generator, command)


async def test_first_chunk_names_the_revision_and_last_carries_finish_and_usage(
    generator: Generator,
) -> None:
    command = GenerateCommand(
        adapter="alpha", prompt_token_ids=(1, 2, 3), sampling=SamplingRequest(max_tokens=3)
    )

    chunks = await _collect(generator, command)

    assert [c.token_ids for c in chunks] == [(0,), (1,), (2,)]
    assert (chunks[0].adapter_name, chunks[0].revision) == ("alpha", 3)
    assert chunks[0].request_id
    assert [c.adapter_name for c in chunks[1:]] == ["", ""]
    assert [c.finish_reason for c in chunks] == [None, None, FinishReason.LENGTH]
    assert chunks[-1].usage == Usage(prompt_tokens=3, completion_tokens=3)


async def test_base_model_is_served_with_empty_adapter(
    generator: Generator, engine: FakeEngine
) -> None:
    command = GenerateCommand(adapter="", prompt_text="hi", sampling=SamplingRequest(max_tokens=1))

    chunks = await _collect(generator, command)

    assert (chunks[0].adapter_name, chunks[0].revision) == ("", 0)


async def test_chunks_stream_before_generation_ends(
    generator: Generator, engine: FakeEngine
) -> None:
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=5)
    )
    stream = generator.generate(command)
    async with contextlib.aclosing(stream):
        first = await anext(stream)
        engine.steps.clear()
        reading = asyncio.ensure_future(anext(stream))
        await eventually(lambda: _waiting_on_a_step(engine), "the stream waits on a step")

        assert first.token_ids == (0,)
        assert not reading.done()
        engine.steps.set()
        assert (await reading).token_ids == (1,)


async def test_closing_the_stream_aborts_the_engine_request(
    generator: Generator, engine: FakeEngine, registry: AdapterRegistry
) -> None:
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=10)
    )
    stream = generator.generate(command)
    first = await anext(stream)
    assert engine.running

    await stream.aclose()

    assert engine.running == {}
    assert any(rid == first.request_id for rid in engine.aborted)
    assert [s.in_flight for s in registry.snapshot()] == [0]


async def test_cancelling_the_consumer_aborts_the_engine_request(
    generator: Generator, engine: FakeEngine
) -> None:
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=10)
    )
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in generator.generate(command):
            started.set()
            engine.steps.clear()

    task = asyncio.create_task(consume())
    await started.wait()
    await eventually(lambda: _waiting_on_a_step(engine), "the consumer waits on a step")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert engine.running == {}
    assert len(engine.aborted) == 1


async def test_requests_beyond_the_admission_bound_are_resource_exhausted(
    engine: FakeEngine, registry: AdapterRegistry, metrics: InferenceMetrics
) -> None:
    generator = _generator(engine, registry, metrics, max_pending=1)
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=3)
    )
    holding = generator.generate(command)
    async with contextlib.aclosing(holding):
        await anext(holding)
        with pytest.raises(ResourceExhausted, match="1 pending"):
            await _collect(generator, command)

    assert len(await _collect(generator, command)) == 3


async def test_engine_abort_is_unavailable(generator: Generator, engine: FakeEngine) -> None:
    engine.finish_with = EngineFinish.ABORT
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=1)
    )
    with pytest.raises(Unavailable, match="aborted"):
        await _collect(generator, command)


async def test_clients_reusing_a_request_id_get_distinct_engine_ids(
    generator: Generator,
) -> None:
    command = GenerateCommand(
        adapter="alpha",
        prompt_text="hi",
        request_id="client-7",
        sampling=SamplingRequest(max_tokens=1),
    )
    first = await _collect(generator, command)
    second = await _collect(generator, command)

    assert first[0].request_id.startswith("client-7")
    assert first[0].request_id != second[0].request_id


async def test_requests_and_tokens_are_counted_per_adapter(
    generator: Generator, metrics: InferenceMetrics
) -> None:
    command = GenerateCommand(
        adapter="alpha", prompt_token_ids=(1, 2), sampling=SamplingRequest(max_tokens=4)
    )
    await _collect(generator, command)

    value = metrics.registry.get_sample_value
    assert value("loraserve_inference_requests_total", {"adapter": "alpha", "code": "OK"}) == 1
    assert value("loraserve_inference_generated_tokens_total", {"adapter": "alpha"}) == 4
    assert value("loraserve_inference_prompt_tokens_total", {"adapter": "alpha"}) == 2
    assert value("loraserve_inference_time_to_first_token_seconds_count") == 1


async def test_n_choices_stream_with_their_index_and_usage_once_at_the_end(
    generator: Generator,
) -> None:
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=2, n=2)
    )
    chunks = await _collect(generator, command)
    assert [(c.index, c.token_ids) for c in chunks] == [(0, (0,)), (1, (0,)), (0, (1,)), (1, (1,))]
    assert [c.finish_reason for c in chunks] == [None, None] + [FinishReason.LENGTH] * 2
    assert [c.usage for c in chunks] == [None, None, None, Usage(3, 4)]


def _counting(
    engine: FakeEngine, registry: AdapterRegistry, metrics: InferenceMetrics
) -> tuple[Generator, Admission, ManualClock]:
    """A generator whose admission reports as of a clock the test moves."""
    clock = ManualClock()
    admission = Admission(4, rates=AdmissionRates(clock))
    return Generator(engine, registry, admission, metrics), admission, clock


def _reported_tokens(admission: Admission, clock: ManualClock) -> dict[str, float]:
    clock.now += RATE_GRID_S
    return admission.tokens_per_sequence(admission.admission_rates())


@pytest.mark.parametrize(
    "refused",
    [
        GenerateCommand(adapter="nobody", prompt_text="hi"),
        GenerateCommand(adapter="alpha", prompt_text=""),
    ],
)
async def test_a_request_refused_before_the_engine_reports_no_tokens(
    engine: FakeEngine,
    registry: AdapterRegistry,
    metrics: InferenceMetrics,
    refused: GenerateCommand,
) -> None:
    generator, admission, clock = _counting(engine, registry, metrics)
    with pytest.raises((NotFound, InvalidArgument)):
        await _collect(generator, refused)
    assert _reported_tokens(admission, clock) == {}


async def test_a_stream_closed_midway_reports_the_tokens_it_generated(
    engine: FakeEngine, registry: AdapterRegistry, metrics: InferenceMetrics
) -> None:
    generator, admission, clock = _counting(engine, registry, metrics)
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=10)
    )
    stream = generator.generate(command)
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    assert _reported_tokens(admission, clock) == pytest.approx({"alpha": 2.0})


async def test_n_choices_report_the_tokens_of_each_sequence(
    engine: FakeEngine, registry: AdapterRegistry, metrics: InferenceMetrics
) -> None:
    generator, admission, clock = _counting(engine, registry, metrics)
    command = GenerateCommand(
        adapter="alpha", prompt_text="hi", sampling=SamplingRequest(max_tokens=3, n=2)
    )
    await _collect(generator, command)
    assert _reported_tokens(admission, clock) == pytest.approx({"alpha": 3.0})

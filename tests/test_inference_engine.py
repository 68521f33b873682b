"""The inference service over real gRPC on the real vLLM engine (CPU build), without the
store: adapters are installed straight into the registry from a temporary cache."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.common.errors import NotFound
from loraserve.inference import servicer
from loraserve.inference.admission import Admission
from loraserve.inference.compat import CompatibilityChecker, model_lora_targets
from loraserve.inference.engine import VllmEngine
from loraserve.inference.generation import Generator
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.registry import AdapterRegistry, LocalRevision
from loraserve.inference.runtime import Runtime, RuntimeSlot
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.grpc import serving
from loraserve.testing.models import TinyAdapterFactory
from loraserve.tiny.builddir import MARKER
from loraserve.tiny.oracle import greedy_tokens

pytestmark = pytest.mark.engine

PROMPT = (1, 40, 41, 42, 43, 44, 45)


class DirFetcher:
    """A `RevisionFetcher` that copies published adapter directories into the cache."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.sources: dict[tuple[str, int], Path] = {}

    async def fetch(self, name: str, revision: int) -> LocalRevision:
        source = self.sources.get((name, revision))
        if source is None:
            raise NotFound(f"adapter {name}@{revision} does not exist")
        return await asyncio.to_thread(copy_into_cache, self.cache_dir, name, revision, source)


def copy_into_cache(cache_dir: Path, name: str, revision: int, source: Path) -> LocalRevision:
    target = cache_dir / name / str(revision)
    if not target.exists():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns(MARKER))
    config = json.loads((target / "adapter_config.json").read_text())
    return LocalRevision(
        name=name,
        revision=revision,
        path=target,
        rank=int(config["r"]),
        target_modules=tuple(config["target_modules"]),
        base_model=str(config["base_model_name_or_path"]),
    )


@dataclass
class Served:
    stub: Any
    registry: AdapterRegistry
    fetcher: DirFetcher
    engine: VllmEngine
    metrics: InferenceMetrics

    async def install(self, name: str, revision: int, source: Path, current: bool = True) -> None:
        self.fetcher.sources[(name, revision)] = source
        rev = await self.fetcher.fetch(name, revision)
        await self.registry.install(rev, make_current=current)


@pytest.fixture(scope="session")
def engine(vllm_engine: Any) -> VllmEngine:
    return VllmEngine(vllm_engine)


@pytest.fixture
async def served_factory(
    engine: VllmEngine, tiny_model_dir: Path, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    """Starts an inference gRPC server on the shared engine; removes its adapters after."""
    registries: list[AdapterRegistry] = []

    async def start(max_pending: int = 64) -> AsyncIterator[Served]:
        cache = tmp_path / f"cache-{len(registries)}"
        cache.mkdir()
        fetcher = DirFetcher(cache)
        info = engine.info
        registry = AdapterRegistry(
            engine,
            cache_dir=cache,
            compat=CompatibilityChecker(
                max_lora_rank=info.max_lora_rank,
                target_modules=model_lora_targets(tiny_model_dir),
                served_model_name=tiny_model_dir.name,
            ),
            fetcher=fetcher,
            max_pinned=info.max_cpu_loras,
        )
        registries.append(registry)
        metrics = InferenceMetrics()
        admission = Admission(max_pending)
        slot = RuntimeSlot(
            Runtime(
                engine=engine,
                registry=registry,
                generator=Generator(engine, registry, admission, metrics),
                admission=admission,
                replica_id="test-replica",
            )
        )
        async with (
            serving(lambda s: servicer.register(s, slot), [servicer.SERVICE_NAME]) as server,
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        ):
            yield Served(pb_grpc.InferenceServiceStub(channel), registry, fetcher, engine, metrics)

    yield start
    for registry in registries:
        for status in registry.snapshot():
            await registry.delete(status.name)
        await registry.settle()


def _greedy(max_tokens: int, adapter: str = "") -> pb.GenerateRequest:
    return pb.GenerateRequest(
        adapter=adapter,
        token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


async def _tokens(stub: Any, request: pb.GenerateRequest) -> tuple[list[int], pb.GenerateResponse]:
    ids: list[int] = []
    first = None
    async for response in stub.Generate(request):
        first = first or response
        ids.extend(response.token_ids)
    assert first is not None
    return ids, first


async def _wait_until_idle(engine: VllmEngine) -> int:
    for _ in range(200):
        if engine.stats().running + engine.stats().waiting == 0:
            break
        await asyncio.sleep(0.05)
    return engine.stats().running


async def test_adapters_in_one_batch_match_the_transformers_oracle(
    served_factory: Callable[..., Any], tiny_adapter: TinyAdapterFactory, tiny_model_dir: Path
) -> None:
    sources = {"alpha": tiny_adapter(seed=1), "beta": tiny_adapter(seed=2)}
    sources["gamma"] = tiny_adapter(rank=16, seed=103)
    async for served in served_factory():
        for name, source in sources.items():
            await served.install(name, 1, source)

        names = ["", *sources]
        results = await asyncio.gather(*(_tokens(served.stub, _greedy(8, n)) for n in names))

        expected = [
            await asyncio.to_thread(greedy_tokens, tiny_model_dir, sources.get(n), PROMPT, 8)
            for n in names
        ]
        assert [ids for ids, _ in results] == expected
        assert len({tuple(ids) for ids, _ in results}) == len(names)
        assert [(first.adapter_name, first.revision) for _, first in results] == [
            ("", 0),
            ("alpha", 1),
            ("beta", 1),
            ("gamma", 1),
        ]


async def test_last_message_carries_finish_reason_and_usage(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory():
        responses = [r async for r in served.stub.Generate(_greedy(5))]

        assert responses[0].request_id
        assert responses[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert responses[-1].usage.prompt_tokens == len(PROMPT)
        assert responses[-1].usage.completion_tokens == 5
        assert all(r.finish_reason == pb.FINISH_REASON_UNSPECIFIED for r in responses[:-1])


async def test_pinned_revision_is_served_beside_the_current_one(
    served_factory: Callable[..., Any], tiny_adapter: TinyAdapterFactory, tiny_model_dir: Path
) -> None:
    rev1, rev2 = tiny_adapter(seed=1), tiny_adapter(seed=2)
    async for served in served_factory():
        served.fetcher.sources[("alpha", 1)] = rev1
        await served.install("alpha", 2, rev2)

        (pinned, pinned_first), (current, current_first) = await asyncio.gather(
            _tokens(served.stub, _greedy(6, "alpha@1")),
            _tokens(served.stub, _greedy(6, "alpha")),
        )

        assert (pinned_first.revision, current_first.revision) == (1, 2)
        assert pinned == await asyncio.to_thread(greedy_tokens, tiny_model_dir, rev1, PROMPT, 6)
        assert current == await asyncio.to_thread(greedy_tokens, tiny_model_dir, rev2, PROMPT, 6)


async def test_request_running_during_a_swap_finishes_on_its_revision(
    served_factory: Callable[..., Any], tiny_adapter: TinyAdapterFactory, tiny_model_dir: Path
) -> None:
    rev1, rev2 = tiny_adapter(seed=1), tiny_adapter(seed=2)
    async for served in served_factory():
        await served.install("alpha", 1, rev1)
        call = served.stub.Generate(_greedy(8, "alpha"))
        first = await anext(aiter(call))

        await served.install("alpha", 2, rev2)
        after_ids, after_first = await _tokens(served.stub, _greedy(8, "alpha"))
        old_ids = list(first.token_ids)
        async for response in call:
            old_ids.extend(response.token_ids)
        await served.registry.settle()

        assert (first.revision, after_first.revision) == (1, 2)
        assert old_ids == await asyncio.to_thread(greedy_tokens, tiny_model_dir, rev1, PROMPT, 8)
        assert after_ids == await asyncio.to_thread(greedy_tokens, tiny_model_dir, rev2, PROMPT, 8)
        assert not served.registry.is_installed("alpha", 1)
        assert len(await served.engine.list_loras()) == 1


async def test_unknown_adapter_is_not_found(served_factory: Callable[..., Any]) -> None:
    async for served in served_factory():
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _tokens(served.stub, _greedy(4, "nobody"))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_sampling_is_invalid_argument(served_factory: Callable[..., Any]) -> None:
    async for served in served_factory():
        request = _greedy(4)
        request.sampling.temperature = 3.0
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _tokens(served.stub, request)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sampling.temperature" in (raised.value.details() or "")


async def test_too_long_request_is_invalid_argument(served_factory: Callable[..., Any]) -> None:
    async for served in served_factory():
        request = _greedy(served.engine.info.max_model_len)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _tokens(served.stub, request)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_model_len" in (raised.value.details() or "")


async def test_cancelling_a_stream_frees_the_engine(
    served_factory: Callable[..., Any], tiny_adapter: TinyAdapterFactory
) -> None:
    async for served in served_factory():
        await served.install("alpha", 1, tiny_adapter(seed=1))
        call = served.stub.Generate(_greedy(400, "alpha"))
        await anext(aiter(call))
        assert served.engine.stats().running + served.engine.stats().waiting == 1

        call.cancel()

        assert await _wait_until_idle(served.engine) == 0
        assert [s.in_flight for s in served.registry.snapshot()] == [0]


async def test_requests_beyond_the_admission_bound_are_resource_exhausted(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory(max_pending=1):
        holding = served.stub.Generate(_greedy(400))
        await anext(aiter(holding))

        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _tokens(served.stub, _greedy(4))
        holding.cancel()

        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await _wait_until_idle(served.engine) == 0


async def test_incompatible_adapter_is_refused_and_listed_as_failed(
    served_factory: Callable[..., Any], tiny_adapter: TinyAdapterFactory
) -> None:
    async for served in served_factory():
        rank = served.engine.info.max_lora_rank * 2
        source = tiny_adapter(rank=rank, seed=5)
        with pytest.raises(Exception, match=f"rank {rank}"):
            await served.install("wide", 1, source)

        listing = await served.stub.ListAdapters(pb.ListAdaptersRequest())
        assert [(a.name, a.state) for a in listing.adapters] == [("wide", pb.ADAPTER_STATE_FAILED)]
        assert f"rank {rank}" in listing.adapters[0].last_error


async def test_server_info_reports_engine_settings_and_adapters(
    served_factory: Callable[..., Any], tiny_adapter: TinyAdapterFactory, tiny_model_dir: Path
) -> None:
    async for served in served_factory(max_pending=7):
        await served.install("alpha", 1, tiny_adapter(seed=1))

        info = await served.stub.GetServerInfo(pb.GetServerInfoRequest())
        listing = await served.stub.ListAdapters(pb.ListAdaptersRequest())

        assert info.model == str(tiny_model_dir)
        assert info.engine.max_pending_requests == 7
        assert info.engine.max_lora_rank == served.engine.info.max_lora_rank
        assert info.engine.device == "cpu"
        assert info.loaded_adapters == 1
        assert info.replica_id == "test-replica"
        [status] = listing.adapters
        assert (status.name, status.revision, status.state, status.current) == (
            "alpha",
            1,
            pb.ADAPTER_STATE_READY,
            True,
        )
        assert status.lora_int_id > 0

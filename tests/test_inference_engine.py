"""The inference service over real gRPC on the real vLLM engine (CPU build), without the
store: adapters are installed straight into the registry from a temporary cache."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.work import engine_work
from loraserve.testing.inference.service import wait_until_idle
from loraserve.testing.streams import MERGED_TRIES, messages, running_stream
from loraserve.tiny.oracle import greedy_tokens

pytestmark = pytest.mark.engine

PROMPT = (1, 40, 41, 42, 43, 44, 45)


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


async def test_stream_interval_holds_tokens_back_but_never_the_first(
    served_factory: Callable[..., Any], tiny_model_dir: Path
) -> None:
    async for served in served_factory():
        request = _greedy(10)
        request.sampling.stream_interval = 4
        # vLLM sends the first token alone, then every 4 tokens, the rest with the finish:
        # [1, 4, 4, 1]. Chunks the server had not yet taken when the next came leave as
        # one message, so where messages end is a subset of where those chunks end; had
        # the first token been held back too, they would end at 4 and 8. A loaded machine
        # may merge all of them into one message, which shows neither: then it tries again.
        for _ in range(MERGED_TRIES):
            responses = await messages(served.stub.Generate(request))
            ends = list(itertools.accumulate(len(r.token_ids) for r in responses))
            assert set(ends) <= {1, 5, 9, 10}
            if len(responses) > 1:
                break
        assert len(responses) > 1
        assert responses[0].request_id
        assert responses[-1].finish_reason == pb.FINISH_REASON_LENGTH
        ids = [t for r in responses for t in r.token_ids]
        assert ids == await asyncio.to_thread(greedy_tokens, tiny_model_dir, None, PROMPT, 10)


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
        served.engine.hold("alpha@1")
        running = asyncio.create_task(_tokens(served.stub, _greedy(8, "alpha")))
        await served.engine.until_held(1, running)

        await served.install("alpha", 2, rev2)
        after_ids, after_first = await _tokens(served.stub, _greedy(8, "alpha"))
        served.engine.let_go()
        old_ids, first = await running
        await served.registry.wait_background()

        assert (first.revision, after_first.revision) == (1, 2)
        assert old_ids == await asyncio.to_thread(greedy_tokens, tiny_model_dir, rev1, PROMPT, 8)
        assert after_ids == await asyncio.to_thread(greedy_tokens, tiny_model_dir, rev2, PROMPT, 8)
        assert not served.registry.is_loaded("alpha", 1)
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


async def test_prompt_longer_than_the_context_is_invalid_argument(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory():
        request = _greedy(4)
        request.token_ids.ids.extend([40] * served.engine.info.max_model_len)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _tokens(served.stub, request)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "prompt" in (raised.value.details() or "")


async def test_cancelling_a_stream_aborts_the_engine_request(
    served_factory: Callable[..., Any], tiny_adapter: TinyAdapterFactory
) -> None:
    async for served in served_factory():
        await served.install("alpha", 1, tiny_adapter(seed=1))
        before = engine_work()
        start = functools.partial(served.stub.Generate, _greedy(400, "alpha"))
        call, ended = await running_stream(start)
        assert served.engine.stats().running + served.engine.stats().waiting == 1

        call.cancel()

        assert await wait_until_idle(served.engine) == 0
        work = engine_work() - before
        # Aborted: neither run to its end nor its 400 tokens made (vLLM's own count), past
        # the streams a loaded machine ran whole before their first message was read.
        assert work.finished_requests == ended
        assert 1 <= work.generated_tokens - 400 * ended < 400
        assert [s.in_flight for s in served.registry.snapshot()] == [0]


async def test_requests_beyond_the_admission_bound_are_resource_exhausted(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory(max_pending=1):
        served.engine.hold("")
        holding = asyncio.create_task(_tokens(served.stub, _greedy(4)))
        await served.engine.until_held(1, holding)
        # Were it admitted, the next request must fail the test, not wait to be let go.
        served.engine.held_lora_name = None

        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await _tokens(served.stub, _greedy(4))
        served.engine.let_go()
        await holding

        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await wait_until_idle(served.engine) == 0


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

"""Canary rollouts on a real inference replica (issue 25, item 3): the real vLLM engine
(CPU build), a real store over gRPC and S3 (moto). The split's share of 1,000
requests, one revision per caller key, and promote and abort moving every request.
Issue 54, item 2: what a caller cannot steer: the arm (its token's principal picks it,
a claimed rollout key only where trusted) and the figures (pinned requests are not
counted; time to first token runs from the engine's submission).
"""

from __future__ import annotations

import asyncio
import time
import types
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.common.rpc.security import ClientSecurity, secure_channel
from loraserve.inference.adapters.rollouts import ROLLOUT_KEY_HEADER, key_fraction
from loraserve.inference.engine import AdapterHandle
from loraserve.inference.serving import generation
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import (
    RunningInference,
    SharedEngine,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

# Keyless requests pick their arm by a golden-ratio sequence, not by chance: any 100 in
# a row put 20 +- 2 of them in a 20 % arm, so 100 tell what 1,000 did.
REQUESTS = 100
# Requests a rollout's change under load sends at the least.
UNDER_LOAD = 400
# Requests in flight at once: enough to keep the engine's batch full.
CONCURRENCY = 32
ALICE = "alice-secret"
# Rollout keys a caller may claim: the hash of the first puts it on the candidate's
# side of a 50 % split of alpha@2, the second on the current revision's.
CLAIMED_CANDIDATE, CLAIMED_CURRENT = "key-0", "key-2"


class Rollout:
    """alpha@1 current and alpha@2 pushed, on a store and one replica following it."""

    def __init__(self, store: store_grpc.AdapterStoreServiceStub, replica: RunningInference):
        self.store = store
        self.replica = replica

    async def served(self, key: str = "", adapter: str = "alpha") -> int:
        """The revision that served one request for `adapter` (with the caller key `key`)."""
        metadata = ((ROLLOUT_KEY_HEADER, key),) if key else ()
        revision = 0
        async for message in self.replica.stub.Generate(
            greedy(adapter, 1), metadata=metadata, timeout=60
        ):
            revision = revision or message.revision
        return int(revision)

    async def served_many(self, keys: list[str]) -> Counter[int]:
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(key: str) -> int:
            async with limit:
                return await self.served(key)

        return Counter(await asyncio.gather(*(one(k) for k in keys)))

    async def applied(self, weight: float | None) -> None:
        """Waits until the replica splits at `weight` (None: no rollout)."""

        async def splits() -> bool:
            candidate = (await self.replica.statuses("alpha")).get(2)
            if weight is None:
                return candidate is None or not candidate.candidate
            return candidate is not None and candidate.rollout_weight == weight

        await eventually(splits, f"the replica splits alpha at {weight}")

    async def start(self, weight: float, wait: bool = True) -> None:
        guards = store_pb.RolloutGuards(abort_on_nack=True)
        request = store_pb.StartRolloutRequest(
            name="alpha", revision=2, weight=weight, guards=guards
        )
        await self.store.StartRollout(request)
        if wait:
            await self.applied(weight)

    def counted(self) -> dict[int, tuple[int, ...]]:
        """Per revision of alpha, the TTFT buckets of the requests the replica counts for
        the store's guards (cumulative; the last entry counts every request)."""
        counters = self.replica.app.metrics.rollouts.counters()
        return {c.revision: c.ttft_buckets for c in counters if c.name == "alpha"}


class HeldCandidateEngine(SharedEngine):
    """Holds alpha@2's add_lora (`holding`) until `release` is set: its load outlasts
    the requests that wait for it."""

    def __init__(self, llm: AsyncLLM, add_calls: list[str]) -> None:
        super().__init__(llm, add_calls)
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    async def add_lora(self, adapter: AdapterHandle) -> None:
        if adapter.lora_name == "alpha@2":
            self.holding.set()
            await self.release.wait()
        await super().add_lora(adapter)


@asynccontextmanager
async def _rollout(
    store_address: str,
    llm: AsyncLLM,
    model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    cache_dir: Path,
    extra: Sequence[str] = (),
    engine_type: type[SharedEngine] = SharedEngine,
) -> AsyncIterator[Rollout]:
    """alpha@1 current and alpha@2 pushed; a replica run with the flags `extra`."""
    async with grpc.aio.insecure_channel(store_address) as channel:
        stub = store_grpc.AdapterStoreServiceStub(channel)
        await push(stub, "alpha", adapter_files(tiny_adapter(seed=1)))
        await push(stub, "alpha", adapter_files(tiny_adapter(seed=2)), no_promote=True)
        async with inference_app(
            llm,
            model_dir=model_dir,
            store_address=store_address,
            cache_dir=cache_dir,
            extra=extra,
            engine_type=engine_type,
        ) as replica:
            yield Rollout(stub, replica)


@pytest.fixture
async def rollout(
    store_server: RunningStore,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Rollout]:
    """With the replica flags the test is parametrized with, if any."""
    extra = getattr(request, "param", ())
    async with _rollout(
        store_server.address, vllm_engine, tiny_model_dir, tiny_adapter, tmp_path / "c", extra
    ) as running:
        yield running


async def test_weight_20_sends_20_percent_of_100_requests_to_the_candidate(
    rollout: Rollout,
) -> None:
    await rollout.start(20)
    served = await rollout.served_many([""] * REQUESTS)
    assert set(served) == {1, 2}
    assert abs(served[2] - 20) <= 2


@pytest.mark.parametrize("rollout", [["--trust-rollout-key-header"]], indirect=True)
async def test_one_trusted_caller_key_always_gets_the_same_revision(rollout: Rollout) -> None:
    await rollout.start(50)
    keys = [f"user-{i}" for i in range(20)]
    served = {key: await rollout.served_many([key] * 5) for key in keys}
    assert all(len(revisions) == 1 for revisions in served.values())
    assert {next(iter(revisions)) for revisions in served.values()} == {1, 2}


async def test_promote_sends_every_request_to_the_candidate(rollout: Rollout) -> None:
    await rollout.start(20)
    await rollout.store.PromoteRollout(
        store_pb.PromoteRolloutRequest(name="alpha", expected_candidate_revision=2)
    )
    await eventually(lambda: _current_is(rollout.replica, 2), "the replica routes alpha@2")
    assert await rollout.served_many([""] * 100 + [f"user-{i}" for i in range(100)]) == {2: 200}


async def test_abort_sends_every_request_to_the_current_revision(rollout: Rollout) -> None:
    await rollout.start(50)
    await rollout.store.AbortRollout(store_pb.AbortRolloutRequest(name="alpha", reason="test"))
    await rollout.applied(None)
    assert await rollout.served_many([""] * 100 + [f"user-{i}" for i in range(100)]) == {1: 200}


async def _current_is(replica: RunningInference, revision: int) -> bool:
    return await replica.current("alpha") == revision


@dataclass
class Load:
    """CONCURRENCY callers sending requests back to back until `stop` is set and
    UNDER_LOAD were sent; the revision that served each, and when each was sent and
    answered, as the caller saw it. Any failed request fails `run`. `changes`: per change
    made under it, when it was asked for and when the replica was seen to apply it."""

    rollout: Rollout
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    served: Counter[int] = field(default_factory=Counter)
    spans: list[tuple[float, float]] = field(default_factory=list)
    sent: int = 0
    changes: dict[str, tuple[float, float]] = field(default_factory=dict)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as callers:
            for _ in range(CONCURRENCY):
                callers.create_task(self._caller())

    async def _caller(self) -> None:
        while not (self.stop.is_set() and self.sent >= UNDER_LOAD):
            # Half of them with caller keys of their own, which pick their arm by hash.
            key = f"u{self.sent}" if self.sent % 2 else ""
            self.sent += 1
            sent_at = time.monotonic()
            revision = await self.rollout.served(key)
            self.spans.append((sent_at, time.monotonic()))
            self.served[revision] += 1

    def in_flight_throughout(self, since: float, until: float) -> bool:
        """Whether some request was in flight at every moment from `since` to `until`."""
        reach = since
        for sent_at, answered_at in sorted(self.spans):
            if sent_at > reach:
                break
            reach = max(reach, answered_at)
        return reach > until


async def _under_load(rollout: Rollout, change: str) -> Load:
    """Starts a rollout, then promotes or aborts it (`change`), while requests stream."""
    load = Load(rollout)
    running = asyncio.create_task(load.run())
    try:
        # The engine's batch is full before anything changes (unless the load failed).
        await eventually(
            lambda: running.done() or len(load.spans) >= CONCURRENCY, "the load is answered"
        )
        asked = time.monotonic()
        await rollout.start(50)
        load.changes["start"] = (asked, time.monotonic())
        asked = time.monotonic()
        if change == "promote":
            await rollout.store.PromoteRollout(
                store_pb.PromoteRolloutRequest(name="alpha", expected_candidate_revision=2)
            )
            await eventually(lambda: _current_is(rollout.replica, 2), "the replica routes alpha@2")
        else:
            await rollout.store.AbortRollout(store_pb.AbortRolloutRequest(name="alpha"))
            await rollout.applied(None)
        load.changes[change] = (asked, time.monotonic())
    except BaseException:
        running.cancel()
        raise
    load.stop.set()
    await running
    return load


def _assert_ran_across(load: Load) -> None:
    assert sum(load.served.values()) == load.sent >= UNDER_LOAD
    assert set(load.served) <= {1, 2}
    for change, (asked, applied) in load.changes.items():
        assert load.in_flight_throughout(asked, applied), f"no request in flight across {change}"


async def test_no_request_fails_while_a_rollout_starts_and_is_promoted_under_load(
    rollout: Rollout,
) -> None:
    _assert_ran_across(await _under_load(rollout, "promote"))


async def test_no_request_fails_while_a_rollout_starts_and_is_aborted_under_load(
    rollout: Rollout,
) -> None:
    _assert_ran_across(await _under_load(rollout, "abort"))


def test_the_claimed_keys_fall_on_both_sides_of_a_50_percent_split() -> None:
    # What the tests below rely on; the hash is the same on every replica and version.
    assert (
        key_fraction("alpha", 2, CLAIMED_CANDIDATE)
        < 0.5
        <= key_fraction("alpha", 2, CLAIMED_CURRENT)
    )


async def test_pinned_requests_are_not_counted_in_the_rollout_counters(
    rollout: Rollout,
) -> None:
    await rollout.start(0)
    await rollout.served_many([""] * 5)
    for _ in range(5):
        assert await rollout.served(adapter="alpha@2") == 2
    assert {revision: ttft[-1] for revision, ttft in rollout.counted().items()} == {1: 5}


async def test_without_a_credential_a_claimed_key_is_spread_as_no_key_is(
    rollout: Rollout,
) -> None:
    await rollout.start(50)
    assert set(await rollout.served_many([CLAIMED_CANDIDATE] * 20)) == {1, 2}


@pytest.fixture
async def token_rollout(
    store_server: RunningStore,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Rollout]:
    """A replica that takes alice's token, called with it; with the flags the test is
    parametrized with."""
    extra = ["--reader-token", f"alice:{ALICE}", *getattr(request, "param", ())]
    async with _rollout(
        store_server.address, vllm_engine, tiny_model_dir, tiny_adapter, tmp_path / "c", extra
    ) as running:
        security = ClientSecurity(token=ALICE)
        async with secure_channel(running.replica.address, security) as channel:
            running.replica.stub = pb_grpc.InferenceServiceStub(channel)
            yield running


async def test_the_callers_principal_picks_its_arm_not_the_key_it_claims(
    token_rollout: Rollout,
) -> None:
    await token_rollout.start(50)
    alices_arm = 2 if key_fraction("alpha", 2, "alice") < 0.5 else 1
    served = {
        await token_rollout.served(key)
        for key in (CLAIMED_CANDIDATE, CLAIMED_CURRENT)
        for _ in range(3)
    }
    assert served == {alices_arm}


@pytest.mark.parametrize("token_rollout", [["--trust-rollout-key-header"]], indirect=True)
async def test_a_claimed_key_picks_the_arm_where_the_replica_trusts_it(
    token_rollout: Rollout,
) -> None:
    await token_rollout.start(50)
    on_candidate = {await token_rollout.served(CLAIMED_CANDIDATE) for _ in range(3)}
    on_current = {await token_rollout.served(CLAIMED_CURRENT) for _ in range(3)}
    assert (on_candidate, on_current) == ({2}, {1})


async def test_ttft_counted_for_a_rollout_runs_from_the_engine_submission(
    store_server: RunningStore,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with _rollout(
        store_server.address,
        vllm_engine,
        tiny_model_dir,
        tiny_adapter,
        tmp_path / "cache",
        engine_type=HeldCandidateEngine,
    ) as rollout:
        await rollout.start(100, wait=False)
        engine = rollout.replica.engine
        assert isinstance(engine, HeldCandidateEngine)
        await eventually(engine.holding.is_set, "alpha@2's load started")
        request = asyncio.create_task(rollout.served())
        runtime = rollout.replica.app.runtime_ref.get()
        await eventually(lambda: runtime.admission.pending == 1, "the request was admitted")
        # The request waits for alpha@2's load. Its clock jumps a day meanwhile: a TTFT
        # counted from admission would land past every bound (30 s).
        skew = types.SimpleNamespace(monotonic=lambda: time.monotonic() + 86_400)
        monkeypatch.setattr(generation, "time", skew)
        engine.release.set()
        assert await request == 2
        ttft = rollout.counted()[2]
        assert (ttft[-2], ttft[-1]) == (1, 1)

"""A fleet of real processes: two `adapterstore serve` and three `inference serve` (each
its own vLLM CPU engine on the tiny model) on one bucket (moto over HTTP).

Which replica served a request is read from each replica's own Prometheus counter of
Generate calls by adapter (`loraserve_inference_requests_total`), scraped before and
after. Three engines share this machine's cores, so every wait is a bounded `eventually`
and nothing measures time.

The failover test SIGKILLs a replica and therefore runs last in this module.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loraserve.adapterctl.failures import EXIT_UNREACHABLE
from loraserve.clients.inference import InferenceClient, RetryPolicy, Sampling
from loraserve.common.errors import LoraserveError
from loraserve.inference.v1 import inference_pb2 as ipb
from loraserve.testing.ctl import ctl
from loraserve.testing.inferenceapp import adapter_files
from loraserve.testing.models import TinyAdapterFactory
from loraserve.testing.processes import (
    InferenceProcess,
    StoreProcess,
    free_port,
    inference_process,
    store_process,
)
from loraserve.testing.s3 import S3Bucket
from loraserve.testing.storecalls import push, store_stub
from loraserve.testing.waiting import eventually

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Three engines starting and loading adapters on two loaded cores: generous guards,
# which only stop a hung test.
FLEET_GUARD_S = 600.0
ADAPTERS = [f"fleet-{i}" for i in range(6)]
PROMPT = [1, 40, 41, 42, 43, 44, 45]
SHORT = Sampling(max_tokens=4, temperature=0.0, ignore_eos=True)
LOAD = Sampling(max_tokens=24, temperature=0.0, ignore_eos=True)
RETRY = RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.5)
REQUESTS_METRIC = "loraserve_inference_requests"
_buckets = itertools.count(1)


@dataclass
class Replica:
    name: str
    process: InferenceProcess
    metrics_port: int

    def served(self) -> Counter[str]:
        """Generate calls this replica finished OK, by adapter, since it started."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        counts: Counter[str] = Counter()
        for family in text_string_to_metric_families(text):
            if family.name != REQUESTS_METRIC:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["code"] == "OK":
                    counts[sample.labels["adapter"]] += int(sample.value)
        return counts


@dataclass
class Fleet:
    stores: list[StoreProcess]
    replicas: list[Replica]

    @property
    def addresses(self) -> str:
        return ",".join(replica.process.address for replica in self.replicas)

    async def served(self) -> dict[str, Counter[str]]:
        return {r.name: await asyncio.to_thread(r.served) for r in self.replicas}

    async def served_by_live(self) -> dict[str, Counter[str]]:
        """`served`, of the replicas still running."""
        live = [r for r in self.replicas if r.process.process.returncode is None]
        return {r.name: await asyncio.to_thread(r.served) for r in live}


@pytest.fixture(scope="module")
async def fleet(
    s3_server: str,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Fleet]:
    """Two stores and three replicas (two on the first store, one on the second), every
    replica serving ADAPTERS at revision 1."""
    bucket = S3Bucket(s3_server, f"fleet-{next(_buckets)}")
    bucket.client().create_bucket(Bucket=bucket.bucket)
    directory = tmp_path_factory.mktemp("fleet")
    async with AsyncExitStack() as stack:
        stores = [
            await stack.enter_async_context(store_process(bucket, directory / f"store-{i}.log"))
            for i in range(2)
        ]
        async with store_stub(stores[0].address) as stub:
            for seed, name in enumerate(ADAPTERS, start=1):
                await push(stub, name, adapter_files(tiny_adapter(seed=seed)))
        replicas = []
        for i in range(3):
            name, port = f"replica-{i}", free_port()
            process = await stack.enter_async_context(
                inference_process(
                    tiny_model_dir,
                    stores[0 if i < 2 else 1].address,
                    directory / f"cache-{i}",
                    directory / f"{name}.log",
                    extra=["--replica-id", name, "--metrics-port", str(port)],
                    guard_s=FLEET_GUARD_S,
                )
            )
            replicas.append(Replica(name, process, port))
        running = Fleet(stores, replicas)
        await eventually(
            lambda: all_serve(running, {name: 1 for name in ADAPTERS}),
            "every replica serves every adapter at revision 1",
            FLEET_GUARD_S,
        )
        yield running


async def all_serve(fleet: Fleet, revisions: dict[str, int]) -> bool:
    """Every replica lists each adapter READY at the given current revision."""
    for replica in fleet.replicas:
        async with InferenceClient(replica.process.address) as client:
            listing = await client.list_adapters()
        ready = {
            a.name: a.revision
            for a in listing.adapters
            if a.current and a.state == ipb.ADAPTER_STATE_READY
        }
        if any(ready.get(name) != revision for name, revision in revisions.items()):
            return False
    return True


def owners(before: dict[str, Counter[str]], after: dict[str, Counter[str]]) -> dict[str, set[str]]:
    """Per adapter, the replicas that served it between two scrapes."""
    served: dict[str, set[str]] = {}
    for replica, counts in after.items():
        for adapter, count in counts.items():
            if count > before[replica][adapter]:
                served.setdefault(adapter, set()).add(replica)
    return served


async def test_every_request_for_an_adapter_is_served_by_one_replica(fleet: Fleet) -> None:
    before = await fleet.served()
    async with InferenceClient(fleet.addresses, retry=RETRY) as client:
        for _ in range(4):
            await asyncio.gather(*(client.generate(name, PROMPT, SHORT) for name in ADAPTERS))
    served = owners(before, await fleet.served())
    assert set(served) == set(ADAPTERS)
    assert all(len(replicas) == 1 for replicas in served.values()), served
    assert len(set().union(*served.values())) > 1, served


async def test_a_push_wait_all_to_either_store_returns_once_every_replica_acked(
    fleet: Fleet, tiny_adapter: TinyAdapterFactory
) -> None:
    name = ADAPTERS[0]
    for store, revision, seed in ((fleet.stores[1], 2, 101), (fleet.stores[0], 3, 102)):
        directory = str(tiny_adapter(seed=seed))
        wait = ("--wait", "all", "--timeout", str(FLEET_GUARD_S))
        pushed = await ctl("push", "--store", store.address, name, directory, *wait)
        assert (pushed.code, pushed.out.strip()) == (0, f"{name}@{revision}"), pushed.err
        # push --wait all returned: every replica has reported the revision already.
        assert await acked(fleet, name, revision)
        await eventually(
            lambda: all_serve(fleet, {name: revision}),  # noqa: B023 - awaited in this turn
            f"every replica serves {name}@{revision}",
            FLEET_GUARD_S,
        )
    for replica in fleet.replicas:
        async with InferenceClient(replica.process.address) as client:
            served = await client.generate(name, PROMPT, SHORT)
        assert (replica.name, served.revision) == (replica.name, 3)


async def acked(fleet: Fleet, name: str, revision: int) -> bool:
    """Both stores' `adapterctl status NAME` show every replica serving `revision`, ACKed."""
    for store in fleet.stores:
        result = await ctl("status", "--store", store.address, "--json", name)
        assert result.code == 0, result.err
        statuses = json.loads(result.out).get("statuses", [])
        acks = {
            s["replica_id"]
            for s in statuses
            if s["type"] == "REPORT_TYPE_ACK"
            and int(s["serving_revision"] or 0) == revision
            and int(s["reported_revision"] or 0) == revision
        }
        if acks != {replica.name for replica in fleet.replicas}:
            return False
    return True


@dataclass
class LoadOutcome:
    ok: int = 0
    failed_before_first_token: int = 0
    failed_after_first_token: int = 0


async def load(
    client: InferenceClient, adapter: str, outcome: LoadOutcome, stop: asyncio.Event
) -> None:
    """Requests for `adapter` one after another until `stop`, each outcome counted."""
    while not stop.is_set():
        got_token = False
        try:
            async for delta in client.stream(adapter, PROMPT, LOAD):
                got_token = got_token or bool(delta.token_ids)
        except LoraserveError:
            if got_token:
                outcome.failed_after_first_token += 1
            else:
                outcome.failed_before_first_token += 1
        else:
            outcome.ok += 1


async def test_an_adapters_requests_move_on_when_its_replica_is_killed(
    fleet: Fleet, tiny_adapter: TinyAdapterFactory
) -> None:
    adapter = ADAPTERS[1]
    before = await fleet.served()
    outcome, stop = LoadOutcome(), asyncio.Event()
    async with InferenceClient(fleet.addresses, retry=RETRY) as client:
        await client.generate(adapter, PROMPT, SHORT)
        (owner,) = owners(before, await fleet.served())[adapter]
        workers = [asyncio.create_task(load(client, adapter, outcome, stop)) for _ in range(3)]
        try:
            await eventually(lambda: outcome.ok >= 3, "load runs on the owner", FLEET_GUARD_S)
            victim = next(r for r in fleet.replicas if r.name == owner)
            await victim.process.kill_group()
            at_kill = outcome.ok
            await eventually(
                lambda: outcome.ok >= at_kill + 6, "load goes on after the kill", FLEET_GUARD_S
            )
        finally:
            stop.set()
            await asyncio.gather(*workers)
    # The killed replica is still live to the store (its reports stop only now): push
    # --wait all names it once the timeout passes.
    directory = str(tiny_adapter(seed=103))
    store = fleet.stores[0].address
    pushed = await ctl("push", "--store", store, adapter, directory, "--wait", "--timeout", "20")
    assert pushed.code == EXIT_UNREACHABLE, pushed.err
    assert f"replica {owner} did not report {adapter}@2 in time" in pushed.err
    moved_to = {
        r.name
        for r in fleet.replicas
        if r.name != owner
        and (await asyncio.to_thread(r.served))[adapter] > before[r.name][adapter]
    }
    assert outcome.failed_before_first_token == 0, outcome
    assert len(moved_to) == 1, (owner, moved_to)

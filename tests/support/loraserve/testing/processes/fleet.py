"""A fleet of real processes for tests: two `adapterstore serve` and three `inference
serve` (each its own vLLM CPU engine on the tiny model) on one bucket (moto over HTTP),
with what tests ask of it: which replica served what, which revision each front
serves a caller, and whether every replica has applied a store seq.

The three replicas start together (three engines loading at once fit this machine's
memory; started one after another they cost three start-ups of wall time). They differ
where a test needs them to: `replica-2` accepts adapters up to rank SMALL_MAX_RANK (the
others 16), so a higher-rank revision is refused there alone; and every replica's
engine fails each request of FAILING_REVISION (`loraserve.testing.inference.faulty`),
which no other test uses. Every replica also serves the OpenAI front.

Three engines share this machine's cores, so every wait is a bounded `eventually` and
nothing measures time.

`process_fleet` is the session's one fleet, shared by every module that asks for it:
its start-up is minutes of a worker, once per run instead of once per module. The
modules that use it run on one worker, in the order
`loraserve.testing.plugins.scheduling.FLEET_MODULES` gives. Its stores and replicas
export their spans to one receiver (`Fleet.spans`), as a deployment's would to its
collector.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loraserve.clients.inference import InferenceClient
from loraserve.inference.adapters import ROLLOUT_KEY_HEADER
from loraserve.inference.v1 import inference_pb2 as ipb
from loraserve.inference.v1 import inference_pb2_grpc as ipb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.starts import engine_starting
from loraserve.testing.inference.app import adapter_files, greedy
from loraserve.testing.inference.faulty import FAILING_ENV
from loraserve.testing.otlp import OtlpReceiver, otlp_receiver
from loraserve.testing.processes.services import (
    InferenceProcess,
    StoreProcess,
    free_port,
    inference_process,
    insecure,
    store_process,
)
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.waiting import FLEET_GUARD_S, eventually

ADAPTERS = [f"fleet-{i}" for i in range(6)]
REPLICAS = 3
# replica-2's --max-lora-rank; the others take 16.
SMALL_MAX_RANK = 8
# The engine LoRA name whose every request fails on every replica.
FAILING_REVISION = "canary-errors@2"
REQUESTS_METRIC = "loraserve_inference_requests"
# Spans leave each replica within a tenth of a second instead of OTLP's 5 s batches.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}


@dataclass
class Replica:
    name: str
    process: InferenceProcess
    metrics_port: int
    openai_port: int

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

    async def listing(self) -> ipb.ListAdaptersResponse:
        async with insecure(self.process.address) as channel:
            stub = ipb_grpc.InferenceServiceStub(channel)
            response: ipb.ListAdaptersResponse = await stub.ListAdapters(
                ipb.ListAdaptersRequest(), timeout=30
            )
        return response


async def _nothing() -> None:
    return None


@dataclass
class Fleet:
    stores: list[StoreProcess]
    replicas: list[Replica]
    bucket: S3Bucket
    # Where every store and replica exports its spans; None: they export none.
    spans: OtlpReceiver | None = None
    # Stops every process of the fleet now (once; the block that started it then has
    # nothing left to stop).
    stop: Callable[[], Awaitable[None]] = _nothing

    @property
    def addresses(self) -> str:
        return ",".join(replica.process.address for replica in self.replicas)

    async def served(self) -> dict[str, Counter[str]]:
        return {r.name: await asyncio.to_thread(r.served) for r in self.replicas}

    async def applied(self, seq: int) -> bool:
        """Whether every replica has applied every store change up to `seq`."""
        listings = await asyncio.gather(*(r.listing() for r in self.replicas))
        return all(listing.store_seq >= seq for listing in listings)

    async def splits(self, name: str, candidate: int, weight: float) -> bool:
        """Whether every replica sends `weight` % of `name` to `candidate`."""
        for listing in await asyncio.gather(*(r.listing() for r in self.replicas)):
            arms = [a for a in listing.adapters if a.name == name and a.revision == candidate]
            if not any(a.candidate and a.rollout_weight == weight for a in arms):
                return False
        return True


@asynccontextmanager
async def running_fleet(
    s3_server: str,
    model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    directory: Path,
    bucket_name: str,
    spans: OtlpReceiver | None = None,
) -> AsyncIterator[Fleet]:
    """Two stores and three replicas (two on the first store, one on the second), every
    replica serving ADAPTERS at revision 1; with `spans`, each exports its spans there."""
    bucket = S3Bucket(s3_server, bucket_name)
    bucket.client().create_bucket(Bucket=bucket.bucket)
    traced = ("--otlp-traces-endpoint", spans.endpoint) if spans is not None else ()
    async with AsyncExitStack() as stack:
        # The guards look at the rollouts twice a second.
        guards = ["--rollout-check-interval", "0.5", *traced]
        stores = [
            await stack.enter_async_context(
                store_process(bucket, directory / f"store-{i}.log", extra=guards)
            )
            for i in range(2)
        ]
        async with store_stub(stores[0].address) as stub:
            for seed, name in enumerate(ADAPTERS, start=1):
                await push(stub, name, adapter_files(tiny_adapter(seed=seed)))
        replicas: list[Replica | None] = [None] * REPLICAS

        async def start(i: int) -> None:
            name, metrics_port, openai_port = f"replica-{i}", free_port(), free_port()
            extra = [
                *("--replica-id", name, "--metrics-port", str(metrics_port)),
                *("--openai-listen", f"127.0.0.1:{openai_port}"),
                # Rollout counters every second: the guards judge within seconds.
                *("--rollout-report-interval", "1"),
                # The tests name callers with x-rollout-key, as a trusted gateway would.
                "--trust-rollout-key-header",
                *(("--max-lora-rank", str(SMALL_MAX_RANK)) if i == REPLICAS - 1 else ()),
                *traced,
            ]
            process = await stack.enter_async_context(
                inference_process(
                    model_dir,
                    stores[0 if i < 2 else 1].address,
                    directory / f"cache-{i}",
                    directory / f"{name}.log",
                    extra=extra,
                    guard_s=FLEET_GUARD_S,
                    module="loraserve.testing.inference.faulty",
                    env={FAILING_ENV: FAILING_REVISION, **(FAST_EXPORT if traced else {})},
                )
            )
            replicas[i] = Replica(name, process, metrics_port, openai_port)

        # Alone: no other worker starts an engine beside these three.
        async with engine_starting(alone=True), asyncio.TaskGroup() as group:
            for i in range(REPLICAS):
                group.create_task(start(i))
        running = Fleet(stores, [r for r in replicas if r is not None], bucket, spans, stack.aclose)
        await eventually(
            lambda: all_serve(running, {name: 1 for name in ADAPTERS}),
            "every replica serves every adapter at revision 1",
            FLEET_GUARD_S,
        )
        yield running


@pytest.fixture(scope="session")
async def process_fleet(
    s3_server: str,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Fleet]:
    """The session's fleet (`running_fleet`, traced), shared by FLEET_MODULES; the last
    of them stops it when it ends (`Fleet.stop`), so its three engines do not take the
    cores for the rest of the run."""
    directory = tmp_path_factory.mktemp("fleet")
    async with (
        otlp_receiver() as spans,
        running_fleet(s3_server, tiny_model_dir, tiny_adapter, directory, "fleet", spans) as fleet,
    ):
        yield fleet


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


async def grpc_revisions(
    replica: Replica, adapter: str, keys: Sequence[str], concurrency: int = 32
) -> list[int]:
    """The revision that served each of one request per key (`""`: no key) on the
    replica's gRPC front, the key in the rollout metadata; a failed request raises."""
    limit = asyncio.Semaphore(concurrency)
    async with insecure(replica.process.address) as channel:
        stub = ipb_grpc.InferenceServiceStub(channel)

        async def one(key: str) -> int:
            metadata = ((ROLLOUT_KEY_HEADER, key),) if key else ()
            async with limit:
                revision = 0
                async for message in stub.Generate(
                    greedy(adapter, 1), metadata=metadata, timeout=FLEET_GUARD_S
                ):
                    revision = revision or int(message.revision)
                return revision

        return list(await asyncio.gather(*(one(key) for key in keys)))


async def grpc_codes(replica: Replica, adapter: str, count: int) -> Counter[str]:
    """The status codes `count` keyless requests for `adapter` end with on the replica."""
    async with insecure(replica.process.address) as channel:
        stub = ipb_grpc.InferenceServiceStub(channel)

        async def one() -> str:
            try:
                async for _ in stub.Generate(greedy(adapter, 1), timeout=FLEET_GUARD_S):
                    pass
            except grpc.aio.AioRpcError as e:
                return str(e.code().name)
            return "OK"

        return Counter(await asyncio.gather(*(one() for _ in range(count))))


async def http_revisions(replica: Replica, adapter: str, keys: Sequence[str]) -> list[int]:
    """As grpc_revisions, on the replica's OpenAI front: the key in the rollout HTTP
    header, the revision from the completion's `model` (`NAME@REV`)."""
    url = f"http://127.0.0.1:{replica.openai_port}"
    async with httpx.AsyncClient(base_url=url, timeout=FLEET_GUARD_S) as http:

        async def one(key: str) -> int:
            headers = {ROLLOUT_KEY_HEADER: key} if key else {}
            body = {"model": adapter, "prompt": "hello", "max_tokens": 1, "temperature": 0}
            reply = await http.post("/v1/completions", json=body, headers=headers)
            assert reply.status_code == 200, reply.text
            model = str(reply.json()["model"])
            assert model.startswith(f"{adapter}@"), model
            return int(model.rsplit("@", 1)[1])

        return list(await asyncio.gather(*(one(key) for key in keys)))

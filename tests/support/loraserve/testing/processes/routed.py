"""Two real inference replicas behind HAProxy (`loraserve.testing.haproxy`, on the deploy
file), on one store over moto's S3, and the streams tests send through it.

Which replica served a request is read from the replicas' own counters of Generate
calls by adapter (`Replica.served`, as `loraserve.testing.processes.fleet` does). A
test that stops a replica leaves a gap that `restore` fills before the next test: a
fresh replica, to which HAProxy's server line of the old one is pointed (its place on
the hash ring follows the line, not the address). The engines share this machine's
cores, so every wait is a bounded `eventually` and nothing measures time.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from loraserve.clients.inference import InferenceClient, RetryPolicy, Sampling
from loraserve.common.errors import LoraserveError
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.haproxy import Haproxy, running_haproxy
from loraserve.testing.haproxy import binary as haproxy_binary
from loraserve.testing.inference.app import adapter_files
from loraserve.testing.processes.fleet import Fleet, Replica, all_serve, owners
from loraserve.testing.processes.services import free_port, inference_process, store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.waiting import FLEET_GUARD_S, eventually

# Two engines starting and loading adapters on two loaded cores: a guard that only stops
# a hung test.
ADAPTERS = [f"routed-{i}" for i in range(4)]
REPLICAS = 2
PROMPT = [1, 40, 41, 42, 43, 44, 45]
# A SIGTERMed replica's NOT_SERVING before it stops taking calls, as deploy/README.md
# asks for behind HAProxy.
SHUTDOWN_DELAY_S = 3.0
# No retries in the client: what the tests count is what HAProxy alone does about a
# replica that fails, as a client in another language without retries would see it.
NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass
class Outcomes:
    """How streams ended, by whether a first token had arrived."""

    ok: int = 0
    failed_before_first_token: int = 0
    failed_after_first_token: int = 0
    errors: list[str] = field(default_factory=list)

    async def stream(self, client: InferenceClient, adapter: str, sampling: Sampling) -> None:
        """One stream for `adapter`, its outcome counted."""
        got_token = False
        try:
            async for delta in client.stream(adapter, PROMPT, sampling):
                got_token = got_token or bool(delta.token_ids)
        except LoraserveError as exc:
            self.errors.append(f"{adapter}: {exc}")
            if got_token:
                self.failed_after_first_token += 1
            else:
                self.failed_before_first_token += 1
        else:
            self.ok += 1

    async def until(
        self, client: InferenceClient, adapter: str, sampling: Sampling, stop: asyncio.Event
    ) -> None:
        """Streams for `adapter` one after another until `stop`."""
        while not stop.is_set():
            await self.stream(client, adapter, sampling)


@asynccontextmanager
async def streaming(
    client: InferenceClient, adapters: Sequence[str], load: Sequence[Sampling]
) -> AsyncIterator[Outcomes]:
    """Streams by `client`, one after another each, as many at once as `load` has
    samplings, the adapters taken in turn, from once each has finished one until the
    block ends (every stream then let finish)."""
    outcomes, stop = Outcomes(), asyncio.Event()
    workers = [
        asyncio.create_task(outcomes.until(client, adapters[i % len(adapters)], sampling, stop))
        for i, sampling in enumerate(load)
    ]
    try:
        await eventually(lambda: outcomes.ok >= len(load), "load runs", FLEET_GUARD_S)
        yield outcomes
    finally:
        stop.set()
        await asyncio.gather(*workers)


@dataclass
class Routed:
    """The replicas (in `fleet`, with their store) and HAProxy in front of them; replica
    i is HAProxy's server line `replica-i`."""

    fleet: Fleet
    haproxy: Haproxy
    _start: _Starter

    def client(self, retry: RetryPolicy = NO_RETRY) -> InferenceClient:
        """A client of HAProxy, as of one inference server; by default it does not retry."""
        return InferenceClient(self.haproxy.address, retry=retry)

    async def homes(self, adapters: Sequence[str], sampling: Sampling) -> dict[str, str]:
        """The replica each adapter's requests go to when nothing else runs: one request
        each, one after another."""
        before = await self.fleet.served()
        async with self.client() as client:
            for adapter in adapters:
                await client.generate(adapter, PROMPT, sampling)
        served = owners(before, await self.fleet.served())
        return {adapter: replicas.pop() for adapter, replicas in served.items()}

    def replica(self, name: str) -> Replica:
        return next(r for r in self.fleet.replicas if r.name == name)

    async def restore(self) -> None:
        """Every replica that exited replaced by a fresh one on its server line, and every
        server line in HAProxy's pool."""
        for i, replica in enumerate(self.fleet.replicas):
            if replica.process.process.returncode is None:
                continue
            fresh = await self._start(replica.name)
            self.fleet.replicas[i] = fresh
            await self.haproxy.move(replica.name, fresh.process.address)
        await eventually(
            lambda: all_serve(self.fleet, {name: 1 for name in ADAPTERS}),
            "every replica serves every adapter",
            FLEET_GUARD_S,
        )
        await eventually(self._all_in_pool, "HAProxy has every replica in its pool", FLEET_GUARD_S)

    async def _all_in_pool(self) -> bool:
        return all([await self.haproxy.in_pool(r.name) for r in self.fleet.replicas])


@dataclass
class _Starter:
    """Starts replicas on the store, each kept until the module's stack closes."""

    stack: AsyncExitStack
    model_dir: Path
    store_address: str
    directory: Path
    _generation: itertools.count[int] = field(default_factory=itertools.count)

    async def __call__(self, name: str) -> Replica:
        generation = next(self._generation)
        metrics_port = free_port()
        process = await self.stack.enter_async_context(
            inference_process(
                self.model_dir,
                self.store_address,
                self.directory / f"cache-{generation}",
                self.directory / f"{name}-{generation}.log",
                extra=[
                    *("--replica-id", name, "--metrics-port", str(metrics_port)),
                    # Longer than HAProxy's checks take to notice NOT_SERVING (2 s).
                    *("--shutdown-delay", str(SHUTDOWN_DELAY_S)),
                ],
                guard_s=FLEET_GUARD_S,
            )
        )
        # No OpenAI front here: port 0.
        return Replica(name, process, metrics_port, openai_port=0)


@asynccontextmanager
async def routed_replicas(
    config: Path,
    s3_server: str,
    model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    directory: Path,
    bucket_name: str,
) -> AsyncIterator[Routed]:
    """A store, REPLICAS replicas serving ADAPTERS at revision 1, and HAProxy on `config`
    with every replica in its pool."""
    # Where HAProxy is missing, this fails before two engines start for nothing.
    haproxy_binary()
    bucket = S3Bucket(s3_server, bucket_name)
    bucket.client().create_bucket(Bucket=bucket.bucket)
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(store_process(bucket, directory / "store.log"))
        async with store_stub(store.address) as stub:
            for seed, name in enumerate(ADAPTERS, start=1):
                await push(stub, name, adapter_files(tiny_adapter(seed=seed)))
        start = _Starter(stack, model_dir, store.address, directory)
        # The engines load side by side: one start-up of wall time, not two.
        replicas = await asyncio.gather(*(start(f"replica-{i}") for i in range(REPLICAS)))
        fleet = Fleet([store], list(replicas), bucket)
        servers = {r.name: r.process.address for r in replicas}
        haproxy = await stack.enter_async_context(
            running_haproxy(config, directory / "haproxy", servers)
        )
        routed = Routed(fleet, haproxy, start)
        await routed.restore()
        yield routed

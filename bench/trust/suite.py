"""Benchmarks 19 and 20 (issue 26): fair admission under a flood, and what signature
verification costs from push to serving.

19. Eight adapters on one replica whose engine admits `max_engine_requests` at once
(fair admission on, the default). Its capacity is probed first (requests/s of a closed
loop at that concurrency); then each repeat runs two open-loop arms of Poisson arrivals,
order rotated: `no flood` (every adapter at r = capacity / 16, half of capacity in all)
and `flood` (one adapter at 10 r, the other 7 at r: 17/16 of capacity, saturated). Each
arm sends for a warm-up (discarded: the flood's queue takes seconds to build) and then
a window; only requests sent in the window count. The no-flood load is set so that its
TTFT p99 is not set by waits for a place: at 0.8 of capacity the same arrivals measured
twice gave p99s from 0.7 to 12 s; at 4/7, where about 1.4 % of requests came while all
16 places were taken, one burst of arrivals that did or did not fill the engine moved
the p99 from 49 to 234 ms on the same arrivals. At half, the places in use pass 16
about 0.3 % of the time. The client's garbage collector is off during an arm. Figures:
the 7 others' TTFT p99 under the flood over their p99 without it (per repeat, paired;
goal <= 1.5), and the flooded adapter's tokens generated inside the window over 1/8 of
all adapters' (goal >= 0.8; the drain after the window is left out, else the share is
set by the arrival counts alone). `no flood` runs twice per repeat: the noise.

20. Push -> serving: from the start of `adapterctl push`'s work (signing included) to
the replica answering a request with the new revision, for a signed push to a store and
replica with `--signature-policy require` over an unsigned push to a pair with `off`.
Both pairs run side by side; each repeat pushes to each once, order rotated (`off`
twice: the noise). The full run pushes an 80 MB adapter (rank 128 on every projection
of a 9-layer, hidden-1024 model); --quick the stack's tiny adapter. Goal <= 1.1.
"""

from __future__ import annotations

import asyncio
import gc
import random
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.method.paired import AGAIN, rotated
from bench.method.report import Report, Section
from bench.method.stats import median_interval, paired_ratio, percentile
from bench.rig import procs
from bench.rig.stack import CACHE, ENGINE_START_S, PROFILES, Stack, tenant
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.common.revisions.manifest import RevisionKey
from loraserve.common.trust.signing import sign_revision
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.pushes import hashed
from loraserve.testing.adapters.signers import KeyPair, write_key_pair
from loraserve.testing.inference.app import adapter_files
from loraserve.testing.processes.services import free_port
from loraserve.testing.store.calls import push, store_stub
from loraserve.tiny.adapters import TinyAdapterSpec, build_tiny_adapter
from loraserve.tiny.model import TinyModelSpec, build_tiny_model

FLOOD, VERIFY = 19, 20
ADAPTERS = tuple(tenant(i) for i in range(8))
FLOODED = ADAPTERS[0]
PROMPT = (5, 17, 42, 99, 3, 250, 7, 64)
ENGINE = procs.EngineConfig(max_loras=8, max_cpu_loras=8)
# The 80 MB adapter's model: rank 128 on all 7 projections of 9 layers at hidden 1024.
BIG_MODEL = TinyModelSpec(
    hidden_size=1024,
    intermediate_size=2048,
    num_hidden_layers=9,
    num_attention_heads=16,
    num_key_value_heads=16,
)
BIG_RANK = 128


@dataclass(frozen=True)
class FloodScale:
    # A p99 turns on the few bursts of arrivals in a window, so the same arrivals
    # measured twice gave ratios of 0.6-1.5 per pair: seven repeats let the interval
    # of the median leave one pair out at either end, where five take the extremes.
    repeats: int = 7
    # A p99 needs hundreds of requests per arm: 50 s gives each arm about 1,000 of the
    # others' 16-token requests.
    window_s: float = 50.0
    warmup_s: float = 10.0
    # Each adapter's rate without the flood, as a fraction of the probed capacity.
    rate_of_capacity: float = 1 / 16
    probe_s: float = 15.0
    max_engine_requests: int = 16
    max_tokens: int = 16
    # One push -> serving of 80 MB varies by ~15 % on 2 cores (2.0-3.9 s): the noise
    # check's interval was +-29 % with 5 pairs, +-13 % with 25 and 4-12 % with 50, the
    # 10 % the goal must resolve at the edge.
    pushes: int = 100


QUICK = FloodScale(repeats=2, window_s=8.0, warmup_s=2.0, probe_s=5.0, pushes=2)


@dataclass
class Sent:
    adapter: str
    at: float
    ttft: float | None = None
    # (time received, tokens) of each streamed message that carried tokens.
    received: list[tuple[float, int]] = field(default_factory=list)
    error: str = ""

    def tokens_between(self, start: float, end: float) -> int:
        """Tokens received in [start, end) (monotonic time)."""
        return sum(n for at, n in self.received if start <= at < end)


async def _generate(stub: Any, adapter: str, max_tokens: int, sent: Sent) -> int:
    """Streams one greedy generation into `sent`; returns the revision that served it."""
    request = pb.GenerateRequest(
        adapter=adapter,
        token_ids=pb.TokenIds(ids=list(PROMPT)),
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )
    revision = 0
    try:
        async for message in stub.Generate(request, timeout=600):
            revision = revision or message.revision
            if message.token_ids:
                now = time.monotonic()
                if sent.ttft is None:
                    sent.ttft = now - sent.at
                sent.received.append((now, len(message.token_ids)))
    except grpc.aio.AioRpcError as exc:
        sent.error = f"{exc.code().name}: {exc.details()}"
    return revision


async def _capacity(stub: Any, scale: FloodScale) -> float:
    """Requests/s the replica completes with `max_engine_requests` streams over every adapter."""
    done = 0
    end = time.monotonic() + scale.probe_s

    async def loop(i: int) -> None:
        nonlocal done
        while time.monotonic() < end:
            adapter = ADAPTERS[i % len(ADAPTERS)]
            await _generate(stub, adapter, scale.max_tokens, Sent(adapter, time.monotonic()))
            done += 1

    start = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(scale.max_engine_requests)))
    return done / (time.monotonic() - start)


async def _open_loop(
    stub: Any, rates: dict[str, float], scale: FloodScale, seed: int
) -> dict[str, float]:
    """Poisson arrivals per adapter over a warm-up and one window; every request then
    runs to its end. Returns the arm's figures, from the window's requests and tokens."""
    arrivals = []
    for adapter, rate in rates.items():
        # One stream of draws per adapter: the 7 others' arrivals are the same in both
        # arms of a repeat, so the pair differs by the flood alone.
        rng = random.Random(f"{seed}:{adapter}")
        t = rng.expovariate(rate)
        while t < scale.warmup_s + scale.window_s:
            arrivals.append((t, adapter))
            t += rng.expovariate(rate)
    sent: list[Sent] = []
    tasks = []
    # The client's collector must not pause the TTFTs it measures: the flood arm holds
    # hundreds of calls at once and the no-flood arm a few, so its sweeps would fall on
    # one arm more than the other. What cycles the arm leaves are collected after it.
    gc.collect()
    gc.disable()
    try:
        start = time.monotonic()
        for offset, adapter in sorted(arrivals):
            await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
            sent.append(Sent(adapter, time.monotonic()))
            tasks.append(asyncio.create_task(_generate(stub, adapter, scale.max_tokens, sent[-1])))
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
    finally:
        gc.enable()
    begin, end = start + scale.warmup_s, start + scale.warmup_s + scale.window_s
    measured = [s for s in sent if s.at >= begin]
    others = [s.ttft for s in measured if s.adapter != FLOODED and s.ttft is not None]
    windowed = {
        a: sum(s.tokens_between(begin, end) for s in sent if s.adapter == a) for a in ADAPTERS
    }
    in_window = sum(windowed.values())
    share = windowed[FLOODED] / (in_window / len(ADAPTERS)) if in_window else 0.0
    total = sum(n for s in sent for _, n in s.received)
    return {
        "others_ttft_p99_ms": 1000 * percentile(others, 99) if others else float("nan"),
        "flooded_share_of_fair": share,
        "tokens_per_s": total / elapsed,
        "requests": len(measured),
        "failed": sum(1 for s in sent if s.error),
    }


@asynccontextmanager
async def _replica(stack: Stack, name: str, extra: Sequence[str]) -> AsyncIterator[Any]:
    port = free_port()
    child = procs.start_inference(
        stack.logs,
        name,
        [*stack.argv(name, port, ENGINE), *extra],
        f"127.0.0.1:{port}",
        stack.profile.env,
    )
    try:
        await procs.wait_serving(child, stack.logs, ENGINE_START_S)
        async with grpc.aio.insecure_channel(child.address) as channel:
            yield pb_grpc.InferenceServiceStub(channel)
    finally:
        child.stop()


async def _flood(section: Section, stack: Stack, scale: FloodScale) -> None:
    for name in ADAPTERS:
        await stack.push(name)
    extra = [f"--max-engine-requests={scale.max_engine_requests}"]
    async with _replica(stack, "flood-replica", extra) as stub:
        capacity = await _capacity(stub, scale)
        r = capacity * scale.rate_of_capacity
        rates = {
            "no flood": {a: r for a in ADAPTERS},
            "flood": {a: 10 * r if a == FLOODED else r for a in ADAPTERS},
        }
        names = ["no flood", "flood", "no flood" + AGAIN]
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for repeat in range(scale.repeats):
            for name in rotated(names, repeat):
                arm_rates = rates[name.removesuffix(AGAIN)]
                runs[name].append(await _open_loop(stub, arm_rates, scale, seed=repeat))
    section.notes.append(
        f"capacity {capacity:.2f} requests/s at {scale.max_engine_requests} streams; "
        f"r = {r:.3f} requests/s per adapter, {FLOODED} at 10 r"
    )
    for arm, figures in runs.items():
        section.record(arm, figures)

    def values(arm: str, metric: str) -> list[float]:
        return [f[metric] for f in runs[arm]]

    p99 = "others_ttft_p99_ms"
    section.goal(
        "others' TTFT p99, flood / no flood",
        paired_ratio(values("flood", p99), values("no flood", p99)),
        "<=",
        1.5,
        ".2f",
        metric=p99,
    )
    section.goal(
        f"{FLOODED}'s tokens/s / (total / 8), flood",
        median_interval(values("flood", "flooded_share_of_fair")),
        ">=",
        0.8,
        ".2f",
    )
    section.noise(
        "no flood, others' TTFT p99, measured twice",
        paired_ratio(values("no flood", p99), values("no flood" + AGAIN, p99)),
        p99,
    )
    failed = sum(f["failed"] for figures in runs.values() for f in figures)
    section.check("failed requests, every arm and repeat", failed, "0", failed == 0)


def _adapter(quick: bool, stack: Stack) -> tuple[Path, Path, int]:
    """The model, the adapter pushed and its rank: the stack's for --quick, else 80 MB."""
    if quick:
        return stack.model_dir, stack.adapters[tenant(0)], 8
    model = build_tiny_model(CACHE / "model-h1024-l9", BIG_MODEL)
    spec = TinyAdapterSpec(rank=BIG_RANK, seed=0)
    return model, build_tiny_adapter(model, CACHE / f"big-r{BIG_RANK}", spec), BIG_RANK


async def _push_to_serving(
    store: str, replica: Any, name: str, files: dict[str, bytes], key: KeyPair | None
) -> float:
    """Seconds from the push's start (signing included) to the replica answering with
    the new revision. Both arms hash the files once, as adapterctl does, signed or not."""
    start = time.monotonic()
    async with store_stub(store) as stub:
        infos = hashed(files)
        signature = b""
        if key is not None:
            request = store_pb.GetNextRevisionRequest(name=name)
            number = (await stub.GetNextRevision(request)).revision
            signature = sign_revision(RevisionKey(name, number), infos, key.private)
        pushed = await push(stub, name, files, signature=signature, infos=infos)
        wanted = pushed.revision.revision
    while True:
        # A request answered by the previous revision: the new one is not routed yet.
        if await _generate(replica, name, 1, Sent(name, time.monotonic())) == wanted:
            return time.monotonic() - start
        await asyncio.sleep(0.01)


async def _verify(section: Section, stack: Stack, scale: FloodScale, quick: bool) -> None:
    model, directory, rank = _adapter(quick, stack)
    stack.model_dir = model
    files = adapter_files(directory)
    key = write_key_pair(stack.work / "keys", "bench")
    trust = ("--signature-policy=require", f"--trusted-signers=bench={key.public}")
    engine = [f"--max-lora-rank={rank}", "--prefetch-adapters=8"]
    assert stack.store is not None
    await asyncio.to_thread(
        procs.s3_client(stack.store_endpoint).create_bucket, Bucket="bench-signed"
    )
    signed = await procs.start_store(
        stack.logs, stack.store_endpoint, "bench-signed", name="adapterstore-require", extra=trust
    )
    stack.children.append(signed)
    pairs = {"off": (stack.store.address, None), "require": (signed.address, key)}
    names = ["off", "require", "off" + AGAIN]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    async with (
        _replica_on(stack, "verify-off", stack.store.address, engine) as off,
        _replica_on(stack, "verify-require", signed.address, [*engine, *trust]) as require,
    ):
        replicas = {"off": off, "require": require}
        for policy, (store, signer) in pairs.items():  # creates the adapter: not timed
            await _push_to_serving(store, replicas[policy], "verify", files, signer)
        for repeat in range(scale.pushes):
            for name in rotated(names, repeat):
                policy = name.removesuffix(AGAIN)
                store, signer = pairs[policy]
                took = await _push_to_serving(store, replicas[policy], "verify", files, signer)
                seconds[name].append(took)
    for name, values in seconds.items():
        section.record_values(name, "push_to_serving_s", values)
    size = sum(len(d) for d in files.values())
    section.notes.append(f"adapter {size / 1e6:.1f} MB (rank {rank}), {len(files)} files")
    for name in ("off", "require"):
        section.reported(f"push -> serving, {name} (s)", median_interval(seconds[name]), ".3f")
    section.goal(
        "push -> serving, require / off",
        paired_ratio(seconds["require"], seconds["off"]),
        "<=",
        1.1,
        ".3f",
        metric="push_to_serving_s",
    )
    section.noise(
        "off, push -> serving, measured twice",
        paired_ratio(seconds["off"], seconds["off" + AGAIN]),
        "push_to_serving_s",
    )


@asynccontextmanager
async def _replica_on(
    stack: Stack, name: str, store: str, extra: Sequence[str]
) -> AsyncIterator[Any]:
    async with _replica(stack, name, [f"--store={store}", *extra]) as stub:
        yield stub


async def run(report: Report, wanted: set[int], *, quick: bool, engine: str = "cpu") -> None:
    """Benchmarks 19 and 20, each on a stack of its own."""
    scale = QUICK if quick else FloodScale()
    parts = {FLOOD: "Fair admission under a 10x flood", VERIFY: "Verification cost"}
    for number in sorted(wanted & set(parts)):
        section = report.section(number, parts[number])
        stack = Stack(
            report.results_dir, Path(tempfile.mkdtemp(prefix="bench-trust-")), PROFILES[engine]
        )
        started = time.monotonic()
        try:
            stack.build_models()
            await stack.start_store()
            if number == FLOOD:
                await _flood(section, stack, scale)
            else:
                await _verify(section, stack, scale, quick)
        except Exception as exc:
            section.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            section.seconds = time.monotonic() - started
            report.print_section(section)
            await stack.close()

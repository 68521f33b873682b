"""One push, followed through the fleet (issue 57's "done when"): `adapterctl push
--trace` to the session's fleet of processes (`process_fleet`), whose stores and
replicas export to one in-process OTLP receiver, gives one trace in which the store's
push is a child of adapterctl's upload, and the sync of the revision on each replica
of that store a child of the store's push, with their download, verify, engine load and
route flip; and the first Generate each of those replicas serves of the new revision is
a trace of its own that links to the push. traced@1 is served first, so @2 loads as each
replica syncs it (make-before-break). It runs before tests/test_fleet.py, whose last
test kills a replica."""

from __future__ import annotations

import re
from collections.abc import Sequence

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.ctl import ctl
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import greedy
from loraserve.testing.otlp import OtlpReceiver, ReceivedSpan
from loraserve.testing.processes.fleet import Fleet
from loraserve.testing.waiting import FLEET_GUARD_S, eventually

pytestmark = [pytest.mark.faults, pytest.mark.slow]

TRACE_ID = re.compile(r"trace_id=([0-9a-f]{32})\b")
# The fleet's replicas of its first store, which the push goes to.
REPLICAS = ("replica-0", "replica-1")
# An adapter no other test of the fleet uses.
ADAPTER = "traced"
REPLICA_STEPS = (
    "loraserve.replica.sync",
    "loraserve.replica.install",
    "loraserve.replica.download",
    "loraserve.replica.engine_load",
    "loraserve.replica.route",
)


def _of(spans: Sequence[ReceivedSpan], name: str, replica: str = "") -> ReceivedSpan:
    found = [
        s for s in spans if s.name == name and (not replica or _replica_of(spans, s) == replica)
    ]
    assert found, f"no span {name} {replica}"
    return found[-1]


def _replica_of(spans: Sequence[ReceivedSpan], span: ReceivedSpan) -> str:
    """The replica whose sync span `span` is or descends from."""
    by_id = {s.span_id: s for s in spans}
    while span.name != "loraserve.replica.sync":
        parent = by_id.get(span.parent_span_id)
        if parent is None:
            return ""
        span = parent
    return str(span.attributes.get("loraserve.replica", ""))


async def _trace(receiver: OtlpReceiver, trace_id: str) -> list[ReceivedSpan]:
    """The push's spans once adapterctl's, the store's (exported in OTLP's 5 s batches)
    and every replica's route flip have arrived."""

    def complete() -> bool:
        spans = [s for s in receiver.spans() if s.trace_id == trace_id]
        routed = {_replica_of(spans, s) for s in spans if s.name == "loraserve.replica.route"}
        names = {s.name for s in spans}
        return routed >= set(REPLICAS) and {"loraserve.ctl.push", "loraserve.store.push"} <= names

    await eventually(complete, "the push's spans from ctl, store and every replica", FLEET_GUARD_S)
    return [s for s in receiver.spans() if s.trace_id == trace_id]


async def _serves(address: str) -> bool:
    try:
        await _generate(address, ADAPTER)
    except grpc.aio.AioRpcError:
        return False
    return True


async def _generate(address: str, adapter: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        async for _ in pb_grpc.InferenceServiceStub(channel).Generate(
            greedy(adapter, 2), timeout=FLEET_GUARD_S
        ):
            pass


async def test_one_push_is_one_trace_across_ctl_store_and_two_replicas(
    process_fleet: Fleet, tiny_adapter: TinyAdapterFactory
) -> None:
    receiver = process_fleet.spans
    assert receiver is not None
    traced = ("--otlp-traces-endpoint", receiver.endpoint)
    store = process_fleet.stores[0]
    replicas = [r.process for r in process_fleet.replicas if r.name in REPLICAS]
    # traced@1 served (so loaded) on both: its next revision loads as it syncs, where a
    # never-served adapter is only routed and loads on its first request.
    first = await ctl("push", ADAPTER, str(tiny_adapter(seed=1)), "--store", store.address)
    assert first.code == 0, first.err
    for process in replicas:
        await eventually(lambda p=process: _serves(p.address), f"{ADAPTER}@1 served", FLEET_GUARD_S)
    pushed = await ctl(
        "push", ADAPTER, str(tiny_adapter(seed=2)), "--trace", "--store", store.address,
        *traced,
    )  # fmt: skip
    assert pushed.code == 0, pushed.err
    [trace_id] = TRACE_ID.findall(pushed.err)
    spans = await _trace(receiver, trace_id)
    before = len(receiver.spans("loraserve.generate"))
    for process in replicas:
        await _generate(process.address, ADAPTER)
    await receiver.wait_for("loraserve.generate", before + len(REPLICAS), FLEET_GUARD_S)
    generates = receiver.spans("loraserve.generate")[before:]

    ctl_upload = _of(spans, "loraserve.ctl.upload_file")
    store_push = _of(spans, "loraserve.store.push")
    assert _of(spans, "loraserve.ctl.push").service == "loraserve-adapterctl"
    assert store_push.service == "loraserve-adapterstore"
    assert store_push.parent_span_id in {s.span_id for s in spans if s.service.endswith("ctl")}
    assert _of(spans, "loraserve.store.commit").parent_span_id == store_push.span_id
    assert ctl_upload.trace_id == trace_id
    for replica in REPLICAS:
        sync = _of(spans, "loraserve.replica.sync", replica)
        assert sync.service == "loraserve-inference"
        assert sync.parent_span_id == store_push.span_id
        steps = {name: _of(spans, name, replica) for name in REPLICA_STEPS}
        assert steps["loraserve.replica.install"].parent_span_id == sync.span_id
        verified = [s for s in spans if s.name == "loraserve.replica.verify"]
        assert any(_replica_of(spans, s) == replica for s in verified)
    linked = {link for span in generates for link in span.links}
    syncs = {(trace_id, _of(spans, "loraserve.replica.sync", r).span_id) for r in REPLICAS}
    assert syncs <= linked
    assert all(span.trace_id != trace_id for span in generates)

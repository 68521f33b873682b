"""Real gRPC servers standing in for inference replicas, for the balancing client's
tests (loraserve.clients.balancing): each answers Generate with its own name and
GetReplicaLoad with the load a test sets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.waiting import eventually


class ReportingReplica(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Answers Generate with its name (after `hold` is set, when given) and reports
    `pending` and `resident` as its load, `rates` its admissions per second by adapter
    (none: a release before them) and `tokens` its tokens per sequence; `reports` False
    answers UNIMPLEMENTED."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending = 0
        self.resident: list[str] = []
        self.reports = True
        self.adapters: dict[str, int] = {}
        self.rates: dict[str, float] = {}
        self.tokens: dict[str, float] = {}
        self.hold: asyncio.Event | None = None
        self.polls = 0
        # Seconds each load report takes to answer.
        self.answers_after = 0.0

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        yield pb.GenerateResponse(text=self.name)
        if self.hold is not None:
            await self.hold.wait()
        yield pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP)

    async def GetReplicaLoad(self, request: Any, context: Any) -> pb.GetReplicaLoadResponse:
        self.polls += 1
        await asyncio.sleep(self.answers_after)
        if not self.reports:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no such method")
        return pb.GetReplicaLoadResponse(
            pending_sequences=self.pending,
            resident_adapters=self.resident,
            replica_id=self.name,
            adapter_pending_sequences=self.adapters,
            adapter_admission_rates=self.rates,
            adapter_tokens_per_sequence=self.tokens,
            reports_tokens_per_sequence=True,
        )


@asynccontextmanager
async def fleet(count: int) -> AsyncIterator[dict[str, tuple[ReportingReplica, grpc.aio.Server]]]:
    """`count` replicas on 127.0.0.1, by address."""
    running: dict[str, tuple[ReportingReplica, grpc.aio.Server]] = {}
    try:
        for i in range(count):
            replica, server = ReportingReplica(f"replica-{i}"), grpc.aio.server()
            pb_grpc.add_InferenceServiceServicer_to_server(replica, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            running[f"127.0.0.1:{port}"] = (replica, server)
        yield running
    finally:
        for _, server in running.values():
            await server.stop(None)


async def polled(replicas: list[ReportingReplica]) -> None:
    """Waits until every replica has been polled twice since now (a fresh report)."""
    marks = [r.polls for r in replicas]
    await eventually(
        lambda: all(r.polls >= m + 2 for r, m in zip(replicas, marks, strict=True)), "polled"
    )


async def reported(running: dict[str, tuple[ReportingReplica, grpc.aio.Server]]) -> None:
    """Waits until a fresh report of every replica is taken."""
    await polled([r for r, _ in running.values()])


def queued_and_quick(replica: ReportingReplica) -> None:
    """One adapter asked for once a second, its requests queued long; another asked for
    three times as often, its requests quick."""
    replica.pending, replica.adapters = 12, {"queued": 9, "quick": 3}
    replica.rates = {"queued": 1.0, "quick": 3.0}

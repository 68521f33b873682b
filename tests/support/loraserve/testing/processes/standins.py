"""Stand-ins for inference replicas where a test's claim is about what sits in front of
them (HAProxy's config and its placement), not about the engine: each is the project's
own gRPC server (health included) in a child process, answering Generate after
`FIRST_TOKEN_S` with `TOKENS` responses, and GetReplicaLoad with its requests in
flight and its admissions per second, kept by the replica's own `Admission`. As child
processes they can be SIGKILLed, which closes their sockets with no GOAWAY, as a
crashed replica's are.

`python -m loraserve.testing.processes.standins PORT` runs one.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2

from loraserve.common.rpc.security import ServerSecurity
from loraserve.common.rpc.server import start_server
from loraserve.inference.serving import SERVICE_NAME
from loraserve.inference.serving.admission import Admission
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.processes.services import ChildProcess, free_port, wait_for_health

# As long as a short generation's queueing and prefill on a loaded replica.
FIRST_TOKEN_S = 0.2
TOKENS = 4
TOKEN_S = 0.02


class StandInReplica(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Streams as a replica does, and reports its load as one does: the requests in
    flight, by adapter name."""

    def __init__(self) -> None:
        # No limit that a test's load could reach: a stand-in never refuses.
        self._admission = Admission(1_000_000)

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        adapter = request.adapter.partition("@")[0]
        with self._admission.admit(1, adapter):
            await asyncio.sleep(FIRST_TOKEN_S)
            for token in range(TOKENS):
                yield pb.GenerateResponse(token_ids=[token])
                await asyncio.sleep(TOKEN_S)
            yield pb.GenerateResponse(finish_reason=pb.FINISH_REASON_LENGTH)
            self._admission.ran(adapter, 1, TOKENS)

    async def GetReplicaLoad(
        self, request: pb.GetReplicaLoadRequest, context: Any
    ) -> pb.GetReplicaLoadResponse:
        rates = self._admission.admission_rates()
        return pb.GetReplicaLoadResponse(
            pending_sequences=self._admission.pending,
            adapter_pending_sequences=self._admission.pending_by_adapter(),
            adapter_admission_rates=rates,
            adapter_tokens_per_sequence=self._admission.tokens_per_sequence(rates),
            reports_tokens_per_sequence=True,
        )


async def _serve(port: int) -> None:
    server = await start_server(
        address=f"127.0.0.1:{port}",
        register=lambda s: pb_grpc.add_InferenceServiceServicer_to_server(StandInReplica(), s),
        service_names=[SERVICE_NAME],
        security=ServerSecurity(),
    )
    await server.set_serving(True)
    await server.server.wait_for_termination()


@asynccontextmanager
async def standin_replicas(
    count: int, directory: Path
) -> AsyncIterator[dict[str, tuple[str, ChildProcess]]]:
    """`count` stand-ins by name (replica-0, ...): each one's HOST:PORT and process,
    SERVING before the block runs; killed when it exits."""
    running: dict[str, tuple[str, ChildProcess]] = {}
    try:
        for i in range(count):
            port = free_port()
            log_path = directory / f"standin-{i}.log"
            with log_path.open("ab") as log_file:
                process = await asyncio.create_subprocess_exec(
                    *(sys.executable, "-m", __name__, str(port)),
                    stdout=log_file,
                    stderr=log_file,
                    start_new_session=True,
                )
            running[f"replica-{i}"] = (f"127.0.0.1:{port}", ChildProcess(process, log_path))
        for address, _ in running.values():
            await wait_for_health(address, health_pb2.HealthCheckResponse.SERVING)
        yield running
    finally:
        for _, child in running.values():
            await child.kill_group()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1])))

"""Malformed adapter references are INVALID_ARGUMENT (HTTP 400) naming the problem, on
every method that takes one, over the real servers.

`x@<20 digits>` once reached the store client as a revision no int64 field can hold
and came back INTERNAL (HTTP 500 through the OpenAI front).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity
from loraserve.inference.adapters import LLAMA_TARGET_MODULES, AdapterRegistry, CompatibilityChecker
from loraserve.inference.cache import AdapterCache
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.openai import RunningHttpServer, create_openai_app, start_http_server
from loraserve.inference.serving import (
    SERVICE_NAME,
    Admission,
    Generator,
    Runtime,
    RuntimeRef,
    register,
)
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.fakes.engine import FakeEngine
from loraserve.testing.grpc import serving
from loraserve.testing.store.calls import store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.store.statuses import report_request, routed

MODEL = "fake-llama"
TWENTY_DIGITS = "9" * 20

# reference -> what the message must say about it
BAD_REFS = {
    f"x@{TWENTY_DIGITS}": "revision must be at most 9223372036854775807",
    "x@9223372036854775808": "revision must be at most 9223372036854775807",
    f"x@{'1' * 5000}": "revision must be at most 9223372036854775807",
    "x@0": "revision must be a positive integer",
    "x@-1": "revision must be a positive integer",
    "x@+1": "revision must be a positive integer",
    "x@1.5": "revision must be a positive integer",
    "x@\u0661": "revision must be a positive integer",
    "x@": "no revision after '@'",
    "x@@1": "more than one '@'",
    "x@1@2": "more than one '@'",
}


@dataclass
class Inference:
    stub: Any
    http: RunningHttpServer


@pytest.fixture(scope="module")
async def inference(
    module_store_server: RunningStore, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Inference]:
    """The inference gRPC service and OpenAI front on a fake engine, fetching pinned
    revisions from a real store; every test here is refused, so they share it."""
    engine = FakeEngine()
    compat = CompatibilityChecker(
        max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name=MODEL
    )
    store = StoreClient.connect(
        StoreClientSettings(module_store_server.address, ClientSecurity(), replica_id="r")
    )
    cache = AdapterCache(tmp_path_factory.mktemp("refs") / "cache", store)
    registry = AdapterRegistry(engine, cache, compat)
    admission = Admission(4)
    runtime_ref = RuntimeRef()
    generator = Generator(engine, registry, admission, InferenceMetrics())
    runtime_ref.set(Runtime(engine, registry, generator, admission, replica_id="r"))
    app = create_openai_app(
        runtime_ref, model_names=[MODEL], security=_no_auth(), is_ready=lambda: True
    )
    http = await start_http_server(app, address="127.0.0.1:0", security=_no_auth())
    try:
        async with (
            serving(lambda server: register(server, runtime_ref), [SERVICE_NAME]) as grpc_server,
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel,
        ):
            yield Inference(pb_grpc.InferenceServiceStub(channel), http)
    finally:
        await http.stop(grace=None)
        await store.close()


def _no_auth() -> ServerSecurity:
    return ServerSecurity()


async def _status(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def _generate(stub: Any, ref: str) -> None:
    request = pb.GenerateRequest(
        adapter=ref, token_ids=pb.TokenIds(ids=[1, 2]), sampling=pb.SamplingParams(max_tokens=2)
    )
    async for _ in stub.Generate(request, timeout=30):
        pass


@pytest.mark.parametrize("ref", list(BAD_REFS))
async def test_generate_with_a_malformed_reference_is_invalid_argument(
    ref: str, inference: Inference
) -> None:
    code, details = await _status(_generate(inference.stub, ref))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, details
    assert BAD_REFS[ref] in details
    assert len(details) < 300


@pytest.mark.parametrize("ref", list(BAD_REFS))
async def test_openai_front_answers_a_malformed_reference_with_400(
    ref: str, inference: Inference
) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{inference.http.port}") as client:
        reply = await client.post(
            "/v1/completions", json={"model": ref, "prompt": "hi", "max_tokens": 2}
        )
    assert reply.status_code == 400, reply.text
    assert BAD_REFS[ref] in reply.json()["error"]["message"]


StoreCall = Callable[[Any, str], Awaitable[Any]]


async def _download(stub: Any, name: str) -> None:
    async for _ in stub.DownloadAdapter(store_pb.DownloadAdapterRequest(name=name), timeout=30):
        pass


STORE_CALLS: dict[str, StoreCall] = {
    "push": lambda stub, name: stream_unary(
        stub.PushAdapter, push_requests(name, tiny_adapter()), timeout=30
    ),
    "get": lambda stub, name: stub.GetAdapter(store_pb.GetAdapterRequest(name=name), timeout=30),
    "revisions": lambda stub, name: stub.ListRevisions(
        store_pb.ListRevisionsRequest(name=name), timeout=30
    ),
    "set-current": lambda stub, name: stub.SetCurrentRevision(
        store_pb.SetCurrentRevisionRequest(name=name, revision=1), timeout=30
    ),
    "delete": lambda stub, name: stub.DeleteAdapter(
        store_pb.DeleteAdapterRequest(name=name), timeout=30
    ),
    "download": _download,
    "status": lambda stub, name: stub.GetAdapterStatus(
        store_pb.GetAdapterStatusRequest(name=name), timeout=30
    ),
    "report": lambda stub, name: stub.ReportReplicaStatus(
        report_request("r", {name: routed(1)}), timeout=30
    ),
}


@pytest.mark.parametrize("method", list(STORE_CALLS))
async def test_store_methods_refuse_malformed_names_with_invalid_argument(
    method: str, module_store_server: RunningStore
) -> None:
    async with store_stub(module_store_server.address) as stub:
        statuses = [
            await _status(STORE_CALLS[method](stub, ref)) for ref in [*BAD_REFS, "a" * 100_000]
        ]
    assert {code for code, _ in statuses} == {grpc.StatusCode.INVALID_ARGUMENT}
    assert all(details.startswith("invalid adapter name") for _, details in statuses)
    assert max(len(details) for _, details in statuses) < 300

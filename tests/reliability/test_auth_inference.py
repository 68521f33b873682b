"""Row 9, inference side: bearer tokens and mTLS on the inference server, and the
inference server's own replica token towards a secured store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, Token, secure_channel
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.certs import CertFiles, make_certs
from loraserve.testing.inference.app import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

REPLICA_ID = "reliability-replica"
STORE_REPLICA = "store-replica-secret"
STORE_WRITER = "store-writer-secret"
CLIENT = "client-secret"


@pytest.fixture
async def secured_store(
    s3_bucket: S3Bucket, tiny_adapter: TinyAdapterFactory
) -> AsyncIterator[RunningStore]:
    """A store that takes tokens only, holding adapter `alpha`."""
    security = ServerSecurity(
        replica_tokens=(Token(REPLICA_ID, STORE_REPLICA),),
        writer_tokens=(Token("ci", STORE_WRITER),),
    )
    async with running_store(s3_bucket, security=security) as store:
        channel = secure_channel(store.address, ClientSecurity(token=STORE_WRITER))
        async with channel:
            stub = store_grpc.AdapterStoreServiceStub(channel)
            await push(stub, "alpha", adapter_files(tiny_adapter(seed=1)))
        yield store


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("inference-certs"))


async def _generate_code(address: str, security: ClientSecurity) -> grpc.StatusCode:
    async with secure_channel(address, security) as channel:
        try:
            async for _ in pb_grpc.InferenceServiceStub(channel).Generate(
                greedy("alpha", 2), timeout=30
            ):
                pass
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.fixture
async def token_inference(
    vllm_engine: AsyncLLM, tiny_model_dir: Path, secured_store: RunningStore, tmp_path: Path
) -> AsyncIterator[RunningInference]:
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=secured_store.address,
        cache_dir=tmp_path / "cache",
        extra=["--reader-token", f"app:{CLIENT}", "--store-token", STORE_REPLICA],
    ) as running:
        yield running


async def test_inference_generate_without_a_token_is_unauthenticated(
    token_inference: RunningInference,
) -> None:
    code = await _generate_code(token_inference.address, ClientSecurity())
    assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_inference_generate_with_a_wrong_token_is_unauthenticated(
    token_inference: RunningInference,
) -> None:
    code = await _generate_code(token_inference.address, ClientSecurity(token="guess"))
    assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_inference_with_a_store_replica_token_syncs_and_serves_a_client_token(
    token_inference: RunningInference,
) -> None:
    code = await _generate_code(token_inference.address, ClientSecurity(token=CLIENT))
    assert code == grpc.StatusCode.OK


async def test_replica_reports_under_the_token_that_names_it(
    token_inference: RunningInference, secured_store: RunningStore
) -> None:
    channel = secure_channel(secured_store.address, ClientSecurity(token=STORE_WRITER))
    async with channel:
        stub = store_grpc.AdapterStoreServiceStub(channel)

        async def reported() -> bool:
            answer = await stub.GetAdapterStatus(store_pb.GetAdapterStatusRequest(name="alpha"))
            return [s.replica_id for s in answer.statuses] == [REPLICA_ID]

        await eventually(reported, f"{REPLICA_ID} reported alpha")


@pytest.fixture
async def mtls_inference(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    secured_store: RunningStore,
    certs: CertFiles,
    tmp_path: Path,
) -> AsyncIterator[RunningInference]:
    flags = [*certs.mtls_flags(), "--store-token", STORE_REPLICA]
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=secured_store.address,
        cache_dir=tmp_path / "cache",
        extra=flags,
    ) as running:
        yield running


def _tls(certs: CertFiles, with_client_cert: bool) -> ClientSecurity:
    return ClientSecurity(
        tls_ca_file=certs.ca_cert,
        tls_cert_file=certs.client_cert if with_client_cert else None,
        tls_key_file=certs.client_key if with_client_cert else None,
    )


async def test_inference_mtls_client_with_a_certificate_is_served(
    mtls_inference: RunningInference, certs: CertFiles
) -> None:
    assert await _generate_code(mtls_inference.address, _tls(certs, True)) == grpc.StatusCode.OK


async def test_inference_mtls_client_without_a_certificate_fails_the_handshake(
    mtls_inference: RunningInference, certs: CertFiles
) -> None:
    code = await _generate_code(mtls_inference.address, _tls(certs, False))
    assert code == grpc.StatusCode.UNAVAILABLE

"""Error mapping and bearer-token roles on a real aio server, unary and streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.common.errors import FailedPrecondition, NotFound
from loraserve.common.rpc.security import Role, ServerSecurity, current_principal, parse_tokens
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.grpc import serving

SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
WRITE_METHOD = f"/{SERVICE}/ListAdapters"


class _Servicer(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(replica_id=current_principal.get())

    async def ListAdapters(self, request: Any, context: Any) -> pb.ListAdaptersResponse:
        raise NotFound("no such adapter 'x'")

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        yield pb.GenerateResponse(text="a")
        if request.adapter == "bug":
            raise ZeroDivisionError("a bug")
        raise FailedPrecondition("rank 64 exceeds max_lora_rank 16")


def _register(server: grpc.aio.Server) -> None:
    pb_grpc.add_InferenceServiceServicer_to_server(_Servicer(), server)


SECURITY = ServerSecurity(
    reader_tokens=parse_tokens("r-secret", "reader"),
    writer_tokens=parse_tokens("alice:w-secret", "writer"),
)


async def _call(port: int, token: str | None, method: str) -> Any:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        call = getattr(stub, method)
        return await call(getattr(pb, f"{method}Request")(), metadata=metadata)


async def test_domain_error_in_unary_call_maps_to_its_status() -> None:
    async with serving(_register, [SERVICE]) as server:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(server.port, None, "ListAdapters")
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert err.value.details() == "no such adapter 'x'"


async def test_domain_error_mid_stream_ends_stream_with_its_status() -> None:
    async with (
        serving(_register, [SERVICE]) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        first = await call.read()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
    assert first.text == "a"
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION


async def test_unexpected_exception_is_internal_without_details() -> None:
    async with (
        serving(_register, [SERVICE]) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(adapter="bug"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
    assert err.value.code() is grpc.StatusCode.INTERNAL
    assert "ZeroDivision" not in (err.value.details() or "")


async def test_missing_token_is_unauthenticated() -> None:
    async with serving(_register, [SERVICE], SECURITY, {WRITE_METHOD: Role.WRITER}) as server:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(server.port, None, "GetServerInfo")
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_wrong_token_is_unauthenticated() -> None:
    async with serving(_register, [SERVICE], SECURITY, {WRITE_METHOD: Role.WRITER}) as server:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(server.port, "nope", "GetServerInfo")
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_reader_token_on_write_method_is_permission_denied() -> None:
    async with serving(_register, [SERVICE], SECURITY, {WRITE_METHOD: Role.WRITER}) as server:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _call(server.port, "r-secret", "ListAdapters")
    assert err.value.code() is grpc.StatusCode.PERMISSION_DENIED


async def test_writer_token_reaches_handler_with_its_principal() -> None:
    async with serving(_register, [SERVICE], SECURITY, {WRITE_METHOD: Role.WRITER}) as server:
        response = await _call(server.port, "w-secret", "GetServerInfo")
    assert response.replica_id == "alice"


async def test_health_needs_no_token() -> None:
    async with (
        serving(_register, [SERVICE], SECURITY, {WRITE_METHOD: Role.WRITER}) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE)
        )
    assert response.status == health_pb2.HealthCheckResponse.SERVING

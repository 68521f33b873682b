"""Client library for the inference service, async and sync.

Backend services call `Generate` through this instead of hand-rolled gRPC: it connects
with a bearer token and TLS, streams text deltas, retries UNAVAILABLE (and CANCELLED
from a server shutting down, and a stream cut short with no status at all) with
exponential backoff and jitter while nothing has been received yet, on another replica
where there are several (a stream that already produced tokens is never replayed),
honours one overall deadline across attempts, and raises `loraserve.common.errors`
types. Given several replicas, it routes each adapter to one of them with a bounded load
(`loraserve.clients.balancing`).

`Generate` is retried with `stamina`, not gRPC's retry policy: gRPC clamps a
policy's attempts at 5, which would silently shrink a caller's `RetryPolicy`.
The unary reads carry gRPC's retry policy (`loraserve.clients.channels`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from loraserve.clients.balancing import RING_HASH, BoundedLoad, Replica, ReplicaSet
from loraserve.clients.channels import Retry, open_channel
from loraserve.clients.generation import Completion, Delta, Sampling, build_request, delta_from
from loraserve.clients.routing import (
    ADAPTER_HASH_HEADER,
    affinity_key,
    channel_for,
    fleet_for,
    may_go_again,
    routed_error,
)
from loraserve.common.errors import DeadlineExceeded, InvalidArgument, error_from_rpc
from loraserve.common.rpc import retrylog
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

__all__ = [
    "RING_HASH",
    "BoundedLoad",
    "Completion",
    "Delta",
    "InferenceClient",
    "RetryPolicy",
    "Sampling",
    "SyncInferenceClient",
]

T = TypeVar("T")

_SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for UNAVAILABLE before the first response of a call."""

    max_attempts: int = 5
    initial_backoff: float = 0.2
    max_backoff: float = 5.0

    def method_configs(self) -> list[dict[str, Any]]:
        """gRPC's retry policy for the service's unary reads (at most 5 attempts)."""
        if self.max_attempts < 2:
            return []
        retry = Retry(self.max_attempts, self.initial_backoff, self.max_backoff)
        return [retry.method_config(_SERVICE, ("ListAdapters", "GetServerInfo"))]


class InferenceClient:
    """Async client; use as `async with InferenceClient(addr) as client:`.

    `address` is one server (`HOST:PORT`), or several replicas: `IP:PORT,IP:PORT,...`
    or `dns:///NAME:PORT`. Across replicas, every request for one adapter goes to its
    own first replica unless that one holds more than `balance_factor` times the fleet's
    mean load (`routing`: `BoundedLoad`, the default, see `loraserve.clients.balancing`;
    `RING_HASH` for gRPC's ring_hash without a bound). The `x-loraserve-adapter` header
    goes with every request, to a single address too, for a proxy that routes by it
    (HAProxy, Envoy).
    """

    def __init__(
        self,
        address: str,
        security: ClientSecurity | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
        routing: BoundedLoad | str | None = None,
    ) -> None:
        """`channel_options` are gRPC channel arguments (e.g. flow-control windows)."""
        self._retry = retry or RetryPolicy()
        self._timeout = timeout
        security = security or ClientSecurity()
        fleet = fleet_for(address, channel_options) if routing != RING_HASH else None
        if routing not in (None, RING_HASH) and not isinstance(routing, BoundedLoad):
            raise InvalidArgument(f"routing must be BoundedLoad() or {RING_HASH!r}")
        self._replicas: ReplicaSet | None = None
        if fleet is not None:
            self._replicas = ReplicaSet(
                fleet.host,
                fleet.addresses,
                lambda one: self._open(one, security, fleet.options, None),
                routing if isinstance(routing, BoundedLoad) else BoundedLoad(),
            )
            return
        route = channel_for(address, channel_options)
        self._channel = self._open(route.target, security, route.options, route.load_balancing)
        self._stub = pb_grpc.InferenceServiceStub(self._channel)

    def _open(
        self,
        target: str,
        security: ClientSecurity,
        options: Sequence[tuple[str, Any]],
        load_balancing: dict[str, Any] | None,
    ) -> grpc.aio.Channel:
        return open_channel(
            target,
            security,
            method_configs=self._retry.method_configs(),
            # ring_hash runs gRPC's client-side health checks on its replicas: one that is
            # NOT_SERVING (starting, draining) counts as down, and its adapters go to the
            # next replica on the ring until it serves.
            health_checked_service=_SERVICE if load_balancing is not None else None,
            load_balancing=load_balancing,
            options=options,
        )

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._replicas is not None:
            await self._replicas.close()
        else:
            await self._channel.close()

    @property
    def placement(self) -> dict[str, str]:
        """Adapter -> the replica address its requests go to within the load bound, as
        this client last placed them; empty for one address or before the first placement."""
        return (None if self._replicas is None else self._replicas.placement) or {}

    async def stream(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | pb.SamplingParams | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[Delta]:
        """Streams deltas for `adapter` ("" base, "NAME", "NAME@REV")."""
        # Closed however the caller stops, so the call is cancelled at once.
        async with aclosing(self.responses(adapter, prompt, sampling, timeout=timeout)) as messages:
            async for message in messages:
                yield delta_from(message)

    async def responses(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | pb.SamplingParams | None = None,
        *,
        timeout: float | None = None,
        request_id: str = "",
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """`stream`, as the service's own messages."""
        request = build_request(adapter, prompt, sampling or Sampling(), request_id)
        metadata = ((ADAPTER_HASH_HEADER, affinity_key(adapter)),)
        budget = timeout if timeout is not None else self._timeout
        deadline = None if budget is None else time.monotonic() + budget
        call, message, replica = await self._first_response(request, metadata, budget, deadline)
        try:
            while message is not grpc.aio.EOF:
                yield message
                message = await call.read()
        except grpc.aio.AioRpcError as exc:
            raise routed_error(exc) from None
        finally:
            call.cancel()
            if replica is not None:
                replica.in_flight -= 1

    async def _first_response(
        self,
        request: pb.GenerateRequest,
        metadata: tuple[tuple[str, str], ...],
        budget: float | None,
        deadline: float | None,
    ) -> tuple[Any, Any, Replica | None]:
        """Starts the call, again while it fails UNAVAILABLE before its first message (on
        another replica where there are several); the call, that message (EOF when the
        stream ended empty) and the replica it runs on, counted there until it ends."""
        tried: list[Replica] = []
        try:
            async for attempt in retrylog.retry_context(
                "inference.generate",
                on=may_go_again,
                attempts=self._retry.max_attempts,
                timeout=budget,
                wait_initial=self._retry.initial_backoff,
                wait_max=self._retry.max_backoff,
                wait_jitter=self._retry.initial_backoff,
            ):
                with attempt:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise DeadlineExceeded(f"deadline of {budget}s passed before a response")
                    replica = None
                    stub = self._stub if self._replicas is None else None
                    if self._replicas is not None:
                        replica = await self._replicas.pick(metadata[0][1], tried)
                        stub, replica.in_flight = replica.stub, replica.in_flight + 1
                    assert stub is not None
                    call = stub.Generate(request, timeout=remaining, metadata=metadata)
                    try:
                        return call, await call.read(), replica
                    except BaseException as exc:
                        call.cancel()
                        if replica is not None:
                            replica.in_flight -= 1
                            tried.append(replica)
                            if self._replicas is not None and may_go_again(exc):
                                self._replicas.down(replica)
                        raise
        except grpc.aio.AioRpcError as exc:
            raise routed_error(exc) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def generate(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | pb.SamplingParams | None = None,
        *,
        timeout: float | None = None,
    ) -> Completion:
        """Runs a generation to the end and returns it whole (its first choice)."""
        return (await self.generate_choices(adapter, prompt, sampling, timeout=timeout))[0]

    async def generate_choices(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | pb.SamplingParams | None = None,
        *,
        timeout: float | None = None,
    ) -> list[Completion]:
        """Runs a generation to the end; every choice (`n` of them), in index order."""
        choices: dict[int, Completion] = {}
        served = ("", 0)
        usage = (0, 0)
        prompt_logprobs: list[pb.PositionLogprobs] = []
        async for delta in self.stream(adapter, prompt, sampling, timeout=timeout):
            if delta.adapter_name or delta.revision:
                served = (delta.adapter_name, delta.revision)
            completion = choices.setdefault(delta.index, Completion())
            completion.text += delta.text
            completion.token_ids.extend(delta.token_ids)
            completion.logprobs.extend(delta.logprobs)
            prompt_logprobs.extend(delta.prompt_logprobs)
            if delta.finish_reason is not None:
                completion.finish_reason = delta.finish_reason
            if delta.prompt_tokens or delta.completion_tokens:
                usage = (delta.prompt_tokens, delta.completion_tokens)
        for completion in choices.values():
            completion.adapter_name, completion.revision = served
            completion.prompt_tokens, completion.completion_tokens = usage
            completion.prompt_logprobs = list(prompt_logprobs)
        return [choices[i] for i in sorted(choices)] or [Completion()]

    async def list_adapters(self) -> pb.ListAdaptersResponse:
        stub = await self._any_stub()
        response: pb.ListAdaptersResponse = await self._unary(
            stub.ListAdapters, pb.ListAdaptersRequest()
        )
        return response

    async def server_info(self) -> pb.GetServerInfoResponse:
        stub = await self._any_stub()
        response: pb.GetServerInfoResponse = await self._unary(
            stub.GetServerInfo, pb.GetServerInfoRequest()
        )
        return response

    async def _any_stub(self) -> pb_grpc.InferenceServiceStub:
        if self._replicas is None:
            return self._stub
        return (await self._replicas.any()).stub

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None


class SyncInferenceClient:
    """Blocking client for code without an event loop; runs `InferenceClient`
    on a private loop thread so both share one retry and error behaviour."""

    def __init__(self, address: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        try:
            self._client = self._run(self._make(address, kwargs))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _make(address: str, kwargs: dict[str, Any]) -> InferenceClient:
        return InferenceClient(address, **kwargs)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncInferenceClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._run(self._client.close())
        self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def stream(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | pb.SamplingParams | None = None,
        *,
        timeout: float | None = None,
    ) -> Iterator[Delta]:
        stream = self._client.stream(adapter, prompt, sampling, timeout=timeout)
        try:
            while True:
                try:
                    yield self._run(anext(stream))  # type: ignore[arg-type]
                except StopAsyncIteration:
                    return
        finally:
            self._run(stream.aclose())  # type: ignore[attr-defined]

    def generate(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | pb.SamplingParams | None = None,
        *,
        timeout: float | None = None,
    ) -> Completion:
        return self._run(self._client.generate(adapter, prompt, sampling, timeout=timeout))

    def generate_choices(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | pb.SamplingParams | None = None,
        *,
        timeout: float | None = None,
    ) -> list[Completion]:
        return self._run(self._client.generate_choices(adapter, prompt, sampling, timeout=timeout))

    def list_adapters(self) -> pb.ListAdaptersResponse:
        return self._run(self._client.list_adapters())

    def server_info(self) -> pb.GetServerInfoResponse:
        return self._run(self._client.server_info())

"""Client library for the inference service, async and sync.

Backend services call `Generate` through this instead of hand-rolled gRPC:
it connects with a bearer token and TLS, streams text deltas, retries
UNAVAILABLE with exponential backoff and jitter while nothing has been received
yet (a stream that already produced tokens is never replayed), honours one
overall deadline across attempts, and raises `loraserve.common.errors` types.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from loraserve.common.backoff import Backoff
from loraserve.common.errors import DeadlineExceeded, Unavailable, error_from_rpc
from loraserve.common.security import ClientSecurity, secure_channel
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

T = TypeVar("T")

_FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for UNAVAILABLE before the first response of a call."""

    max_attempts: int = 5
    initial_backoff: float = 0.2
    max_backoff: float = 5.0

    def backoff(self) -> Backoff:
        """A fresh backoff for one call's retries."""
        return Backoff(self.initial_backoff, self.max_backoff)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters; None leaves the server's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    ignore_eos: bool = False

    def to_proto(self) -> pb.SamplingParams:
        params = pb.SamplingParams(stop=list(self.stop), ignore_eos=self.ignore_eos)
        for name in ("max_tokens", "temperature", "top_p", "top_k", "seed"):
            value = getattr(self, name)
            if value is not None:
                setattr(params, name, value)
        return params


@dataclass(frozen=True)
class Delta:
    """One streamed piece of a generation."""

    text: str
    token_ids: tuple[int, ...]
    # Set on the first delta: what was actually served.
    adapter_name: str = ""
    revision: int = 0
    # Set on the last delta.
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Completion:
    """A whole generation, as `generate` returns it."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    adapter_name: str = ""
    revision: int = 0
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _delta(message: pb.GenerateResponse) -> Delta:
    return Delta(
        text=message.text,
        token_ids=tuple(message.token_ids),
        adapter_name=message.adapter_name,
        revision=message.revision,
        finish_reason=_FINISH_REASONS.get(message.finish_reason),
        prompt_tokens=message.usage.prompt_tokens,
        completion_tokens=message.usage.completion_tokens,
    )


def _request(adapter: str, prompt: str | Sequence[int], sampling: Sampling) -> pb.GenerateRequest:
    request = pb.GenerateRequest(adapter=adapter, sampling=sampling.to_proto())
    if isinstance(prompt, str):
        request.text = prompt
    else:
        request.token_ids.ids.extend(prompt)
    return request


class InferenceClient:
    """Async client; use as `async with InferenceClient(addr) as client:`."""

    def __init__(
        self,
        address: str,
        security: ClientSecurity | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> None:
        self._channel = secure_channel(address, security or ClientSecurity())
        self._stub = pb_grpc.InferenceServiceStub(self._channel)
        self._retry = retry or RetryPolicy()
        self._timeout = timeout

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def stream(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | None = None,
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[Delta]:
        """Streams deltas for `adapter` ("" base, "NAME", "NAME@REV")."""
        request = _request(adapter, prompt, sampling or Sampling())
        budget = timeout if timeout is not None else self._timeout
        deadline = None if budget is None else time.monotonic() + budget
        backoff = self._retry.backoff()
        attempt = 0
        while True:
            attempt += 1
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(f"deadline of {budget}s passed before a response")
            call = self._stub.Generate(request, timeout=remaining)
            received = False
            try:
                async for message in call:
                    received = True
                    yield _delta(message)
                return
            except grpc.aio.AioRpcError as exc:
                error = error_from_rpc(exc)
                if received or not isinstance(error, Unavailable):
                    raise error from None
                if attempt >= self._retry.max_attempts:
                    raise error from None
            finally:
                call.cancel()
            await asyncio.sleep(backoff.next_delay())

    async def generate(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | None = None,
        *,
        timeout: float | None = None,
    ) -> Completion:
        """Runs a generation to the end and returns it whole."""
        completion = Completion()
        async for delta in self.stream(adapter, prompt, sampling, timeout=timeout):
            if delta.adapter_name or delta.revision:
                completion.adapter_name, completion.revision = delta.adapter_name, delta.revision
            completion.text += delta.text
            completion.token_ids.extend(delta.token_ids)
            if delta.finish_reason is not None:
                completion.finish_reason = delta.finish_reason
                completion.prompt_tokens = delta.prompt_tokens
                completion.completion_tokens = delta.completion_tokens
        return completion

    async def list_adapters(self) -> pb.ListAdaptersResponse:
        response: pb.ListAdaptersResponse = await self._unary(
            self._stub.ListAdapters, pb.ListAdaptersRequest()
        )
        return response

    async def server_info(self) -> pb.GetServerInfoResponse:
        response: pb.GetServerInfoResponse = await self._unary(
            self._stub.GetServerInfo, pb.GetServerInfoRequest()
        )
        return response

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
        self._client = self._run(self._make(address, kwargs))

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
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def stream(
        self,
        adapter: str,
        prompt: str | Sequence[int],
        sampling: Sampling | None = None,
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
        sampling: Sampling | None = None,
        *,
        timeout: float | None = None,
    ) -> Completion:
        return self._run(self._client.generate(adapter, prompt, sampling, timeout=timeout))

    def list_adapters(self) -> pb.ListAdaptersResponse:
        return self._run(self._client.list_adapters())

    def server_info(self) -> pb.GetServerInfoResponse:
        return self._run(self._client.server_info())

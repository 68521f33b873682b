"""The optional OpenAI-compatible HTTP front: translates HTTP/JSON to Generate and back.

It sits beside the gRPC servicer and, like it, only translates: sampling validation,
admission, adapter routing and engine aborts are loraserve.inference.serving.generation's.
Errors are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`) with the
HTTP status mapped from the domain error in one table. A streamed request's first
chunk is awaited before the response starts, so what fails before the first token
(an unknown model, a bad parameter, a full server) gets its HTTP status; a failure
after that ends the stream with an `error` event and no `[DONE]`. A client that goes
away, streamed or not, aborts its engine request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException

from loraserve.common.config.textlimits import capped_message
from loraserve.common.errors import InvalidArgument, LoraserveError, QuotaExceeded, Unavailable
from loraserve.common.rpc.auth import TokenAuth
from loraserve.common.rpc.grpcutil import retry_after
from loraserve.common.rpc.security import ServerSecurity
from loraserve.inference.openai.callers import for_caller
from loraserve.inference.openai.events import EventStream
from loraserve.inference.openai.guard import RequestGuard
from loraserve.inference.openai.protocol import (
    NO_CHAT_TEMPLATE,
    ChatTemplating,
    ErrorType,
    adapter_for_model,
    chat_command,
    chat_messages,
    completion_commands,
    error_body,
    model_list,
)
from loraserve.inference.openai.reply import Echo, Reply, served_model
from loraserve.inference.openai.requests import ChatRequest, CompletionRequest
from loraserve.inference.openai.streams import close_all, firsts, merged, resumed
from loraserve.inference.serving import GenerateCommand, GenerationChunk, RuntimeRef
from loraserve.inference.settings import DEFAULT_OPENAI_MAX_BODY_BYTES

log = logging.getLogger(__name__)

T = TypeVar("T")

# HTTP 499: the client closed the request; nobody reads this response.
_CLIENT_GONE = 499

_STATUS: dict[grpc.StatusCode, tuple[int, ErrorType]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "conflict_error"),
    grpc.StatusCode.ABORTED: (409, "conflict_error"),
    # Well formed, but not applicable to what is served (e.g. an incompatible adapter).
    grpc.StatusCode.FAILED_PRECONDITION: (422, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.CANCELLED: (_CLIENT_GONE, "invalid_request_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
}
_INTERNAL: tuple[int, ErrorType] = (500, "internal_error")
# Retryable statuses tell clients when to come back.
_RETRY_AFTER_S = {429: "1", 503: "1"}


def http_error(exc: LoraserveError) -> JSONResponse:
    """The one mapping from a domain error to an OpenAI-shaped HTTP error."""
    status, error_type = _STATUS.get(exc.code, _INTERNAL)
    headers = {"retry-after": _RETRY_AFTER_S[status]} if status in _RETRY_AFTER_S else None
    if isinstance(exc, QuotaExceeded):
        headers = {"retry-after": retry_after(exc.retry_after_s)}
    body = error_body(capped_message(exc.message), error_type, exc.code.name.lower())
    return JSONResponse(body, status_code=status, headers=headers)


def create_openai_app(
    runtime_ref: RuntimeRef,
    *,
    model_names: Sequence[str],
    security: ServerSecurity,
    is_ready: Callable[[], bool],
    max_body_bytes: int = DEFAULT_OPENAI_MAX_BODY_BYTES,
    metrics: CollectorRegistry | None = None,
    public_metrics: bool = False,
    stalled_write_s: float | None = None,
) -> FastAPI:
    """The HTTP app; `model_names[0]` is the base model's listed name, all of them name it.

    Tokens (or, in protected mode, the client's address) and body sizes are checked by
    `RequestGuard` before a body is read. With `metrics`, GET /metrics serves them on
    this port too: an inference-extension endpoint picker scrapes the port it routes to,
    as it does vLLM's. They name every adapter and its traffic, so they take a token like
    the API unless `public_metrics`. A streamed response its client leaves unread for
    `stalled_write_s` is ended (see `EventStream`).
    """
    if not model_names:
        raise ValueError("model_names needs the served model's name")
    auth = TokenAuth(security, carrier="header") if security.auth_enabled else None
    app = FastAPI(
        title="loraserve OpenAI-compatible API", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(
        RequestGuard,
        auth=auth,
        loopback_only=security.loopback_only,
        max_body_bytes=max_body_bytes,
        # /health is open like gRPC health, for load balancers.
        open_paths=("/health", "/metrics") if public_metrics else ("/health",),
        error_response=http_error,
    )

    app.state.stalled_write_s = stalled_write_s
    _add_probes(app, is_ready, metrics)
    _add_generation(app, runtime_ref, model_names)
    _add_error_handlers(app)
    return app


def _add_probes(
    app: FastAPI, is_ready: Callable[[], bool], metrics: CollectorRegistry | None
) -> None:
    @app.get("/health")
    async def health() -> Response:
        # 503 until the first sync is done.
        return Response(status_code=200 if is_ready() else 503)

    if metrics is not None:

        @app.get("/metrics")
        async def prometheus_metrics() -> Response:
            body = await asyncio.to_thread(generate_latest, metrics)
            return Response(body, media_type=CONTENT_TYPE_LATEST)


def _add_generation(app: FastAPI, runtime_ref: RuntimeRef, model_names: Sequence[str]) -> None:
    base_name = model_names[0]
    created = int(time.time())

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        served = runtime_ref.get().registry
        return JSONResponse(model_list(base_name, served.snapshot(), served.pin_policy, created))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        runtime = runtime_ref.get()
        adapter = adapter_for_model(body.model, model_names)
        commands = [
            for_caller(c, runtime_ref, request, body.user)
            for c in completion_commands(body, adapter, _request_id(request))
        ]
        streams = [runtime.generator.generate(command) for command in commands]
        echo = _Echoes(runtime.engine, commands) if body.echo else None
        return await _respond(request, streams, body, base_name, echo)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        runtime = runtime_ref.get()
        messages = chat_messages(body)
        adapter = adapter_for_model(body.model, model_names)
        # Rendered once admitted: a request refused at the door costs no template.
        render = functools.partial(_chat_prompt_ids, runtime.engine, messages)
        command = chat_command(body, adapter, _request_id(request), render_prompt=render)
        command = for_caller(command, runtime_ref, request, body.user)
        streams = [runtime.generator.generate(command)]
        return await _respond(request, streams, body, base_name)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LoraserveError)
    async def domain_error(request: Request, exc: LoraserveError) -> JSONResponse:
        return http_error(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        return http_error(InvalidArgument(_validation_message(exc)))

    @app.exception_handler(HTTPException)
    async def http_exception(request: Request, exc: HTTPException) -> JSONResponse:
        error_type: ErrorType = (
            "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        )
        body = error_body(str(exc.detail), error_type, str(exc.status_code))
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("openai.internal_error path=%s", request.url.path, exc_info=exc)
        status, error_type = _INTERNAL
        body = error_body("internal error; see the server log", error_type, "internal")
        return JSONResponse(body, status_code=status)


def _request_id(request: Request) -> str:
    return request.headers.get("x-request-id", "")


async def _chat_prompt_ids(engine: object, messages: list[dict[str, str]]) -> list[int]:
    ids = await engine.chat_prompt_ids(messages) if isinstance(engine, ChatTemplating) else None
    if ids is None:
        # As vLLM's server: no template is made up for a model that has none.
        raise InvalidArgument(NO_CHAT_TEMPLATE)
    return ids


@dataclass(frozen=True)
class _Echoes:
    """What completions' echo repeats: each prompt's text, or its ids detokenized."""

    engine: Any
    commands: Sequence[GenerateCommand]

    def of(self, first_chunks: Sequence[GenerationChunk]) -> list[Echo]:
        echoes = []
        for command, chunk in zip(self.commands, first_chunks, strict=True):
            ids = chunk.prompt_token_ids
            text = command.prompt_text
            echoes.append(
                Echo(
                    text=text if text is not None else self.engine.decode(ids),
                    first_token_text=self.engine.decode(ids[:1]),
                )
            )
        return echoes


async def _respond(
    request: Request,
    streams: list[AsyncGenerator[GenerationChunk, None]],
    body: CompletionRequest | ChatRequest,
    base_name: str,
    echo: _Echoes | None = None,
) -> Response:
    try:
        first_chunks = await _unless_disconnected(request, firsts(streams))
    except StopAsyncIteration as exc:
        await close_all(streams)
        raise Unavailable("the generation ended before its first chunk") from exc
    except BaseException:
        await close_all(streams)
        raise
    if first_chunks is None:
        await close_all(streams)
        return Response(status_code=_CLIENT_GONE)
    first = first_chunks[0]
    chat = isinstance(body, ChatRequest)
    reply = Reply(
        chat=chat,
        first=first,
        model=served_model(first, base_name),
        token_ids=body.return_token_ids,
        n=body.n or 1,
        logprobs=(body.logprobs is not None) if not chat else bool(body.logprobs),
        echo=echo.of(first_chunks) if echo is not None else (),
    )
    chunks = merged([resumed(c, s) for c, s in zip(first_chunks, streams, strict=True)])
    headers = {"x-request-id": first.request_id}
    if body.stream:
        events = _events(reply, chunks, body.include_usage, len(streams))
        stalled_write_s = request.app.state.stalled_write_s
        return EventStream(events, [chunks, *streams], headers, stalled_write_s)
    try:
        done = await _unless_disconnected(request, _collect(reply, chunks))
    finally:
        await chunks.aclose()
        await close_all(streams)
    if done is None:
        return Response(status_code=_CLIENT_GONE)
    return JSONResponse(reply.response(), headers=headers)


async def _collect(reply: Reply, chunks: AsyncIterator[tuple[int, GenerationChunk]]) -> Reply:
    async for stream, chunk in chunks:
        reply.add(stream, chunk)
    return reply


async def _events(
    reply: Reply,
    chunks: AsyncIterator[tuple[int, GenerationChunk]],
    include_usage: bool,
    prompts: int,
) -> AsyncGenerator[str, None]:
    if reply.chat:
        for event in reply.role_chunks(range(prompts * reply.n)):
            yield _sse(event)
    try:
        async for stream, chunk in chunks:
            delta = reply.chunk(stream, chunk)
            if delta is not None:
                yield _sse(delta)
    except LoraserveError as exc:
        # Headers are out already: the error can only travel as an event. No [DONE]
        # follows, so clients that wait for it see the stream as cut short.
        message = capped_message(exc.message)
        log.info("openai.stream_failed request_id=%s error=%s", reply.first.request_id, message)
        yield _sse(error_body(message, _STATUS.get(exc.code, _INTERNAL)[1], exc.code.name.lower()))
        return
    if include_usage:
        yield _sse(reply.usage_chunk())
    yield "data: [DONE]\n\n"


# One encoder for every event: json.dumps with separators builds a new one per call.
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _sse(event: dict[str, Any]) -> str:
    return f"data: {_encode(event)}\n\n"


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None if the client went away first (and `work` was cancelled).

    Needs the request body read already: the only message left to receive is the
    disconnect.
    """
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            # The cancel must land (and the engine request end) before anything goes on.
            await asyncio.wait({task})
    if task.cancelled():
        log.info("openai.client_disconnected path=%s", request.url.path)
        return None
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _validation_message(exc: RequestValidationError) -> str:
    problems = []
    for error in exc.errors()[:3]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
        problems.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(problems)

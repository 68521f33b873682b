"""What the OpenAI front checks before it reads a request body: the token (or, in
protected mode, that the client is local), then the size.

FastAPI reads and parses a body before it runs any dependency, so a token check there
comes after the whole body is in memory: 200 MiB without a token cost seconds and
hundreds of MiB before the 401. This ASGI middleware runs first. It answers 401 from
the headers and the client's address alone, 413 from a Content-Length over the limit,
and 413 as soon as a body without one (chunked) grows past the limit, without reading
the rest. A body within the limit is read here and handed on unchanged.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Collection

from starlette.datastructures import Headers
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loraserve.common.errors import LoraserveError
from loraserve.common.rpc.auth import TokenAuth
from loraserve.common.rpc.protected import is_loopback_host, refusal
from loraserve.inference.openai.protocol import error_body

log = logging.getLogger(__name__)

_TOO_LARGE = 413


class RequestGuard:
    """Authenticates and bounds each HTTP request before the app sees it."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        auth: TokenAuth | None,
        loopback_only: bool,
        max_body_bytes: int,
        open_paths: Collection[str],
        error_response: Callable[[LoraserveError], Response],
    ) -> None:
        self._app = app
        self._auth = auth
        self._loopback_only = loopback_only
        self._max = max_body_bytes
        self._open_paths = frozenset(open_paths)
        self._error_response = error_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open_paths:
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self._loopback_only:
            # uvicorn gives no client for a peer it cannot name: that one is remote too.
            client = scope.get("client") or ("", 0)
            if not is_loopback_host(client[0]):
                refused = refusal(client[0] or "an unknown address")
                await _unread(self._error_response(refused))(scope, receive, send)
                return
        if self._auth is not None:
            try:
                self._auth.authenticate(
                    [("authorization", value) for value in headers.getlist("authorization")]
                )
            except LoraserveError as exc:
                await _unread(self._error_response(exc))(scope, receive, send)
                return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max:
            await self._too_large(f"request body of {int(declared)} bytes")(scope, receive, send)
            return
        messages = await self._read_body(receive)
        if messages is None:
            await self._too_large("request body")(scope, receive, send)
            return
        pending = deque(messages)

        async def replay() -> Message:
            return pending.popleft() if pending else await receive()

        await self._app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> list[Message] | None:
        """The body's messages; None once it passes the limit (the rest is left unread)."""
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages  # The client went away; the app will see that.
            size += len(message.get("body", b""))
            if size > self._max:
                return None
            if not message.get("more_body", False):
                return messages

    def _too_large(self, what: str) -> Response:
        log.info("openai.body_too_large limit=%d", self._max)
        message = f"{what} is over the limit of {self._max} bytes (--openai-max-body-size)"
        body = error_body(message, "invalid_request_error", "request_too_large")
        return _unread(JSONResponse(body, status_code=_TOO_LARGE))


def _unread(response: Response) -> Response:
    """`response` to a request whose body is left unread: the connection cannot carry
    another request, so it closes after this one."""
    response.headers["connection"] = "close"
    return response

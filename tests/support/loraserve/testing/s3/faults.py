"""An HTTP/1.1 proxy in front of the S3 endpoint that injects faults per request.

boto3 keeps connections alive and sends one request after another on each, so the
proxy reads every request's head and body framing itself (Content-Length or
chunked) and decides, request by request, whether to forward it, hold it, or cut
the connection part-way through the request body or the response. Responses are
piped back unparsed except where a rule cuts them.

Rules match a method and a key prefix (the part of a path-style URL after the
bucket); the first matching rule applies, and each applies at most `times` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest

from loraserve.testing.s3.endpoint import S3Bucket

log = logging.getLogger(__name__)

_BUFFER = 64 * 1024
_MAX_HEAD = 64 * 1024
_REFUSAL_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>refused by the S3 fault proxy</Message></Error>"
)
_REFUSAL = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
    + f"Content-Length: {len(_REFUSAL_BODY)}\r\n\r\n".encode()
    + _REFUSAL_BODY
)


class Fault(enum.Enum):
    # Hold the request, unforwarded, until `release()` forwards or `drop()` cuts it.
    STALL = "stall"
    # Forward the head and `after_bytes` of the body, then cut both connections.
    CUT_REQUEST = "cut-request"
    # Forward the request, then `after_bytes` of the response, then cut both connections.
    CUT_RESPONSE = "cut-response"
    # Answer 403 AccessDenied without forwarding: an error the SDK does not retry.
    REFUSE = "refuse"
    # Forward the request without its `If-None-Match` header, as a backend that
    # ignores conditional writes would treat it.
    STRIP_IF_NONE_MATCH = "strip-if-none-match"


@dataclass
class Rule:
    """One fault for requests of `method` whose object key starts with `key_prefix`."""

    fault: Fault
    method: str
    key_prefix: str
    after_bytes: int = 0
    times: int | None = None  # None: every matching request
    after: Rule | None = None  # armed only once this other rule has applied
    hits: int = 0
    hit: asyncio.Event = field(default_factory=asyncio.Event)

    def matches(self, method: str, key: str) -> bool:
        exhausted = self.times is not None and self.hits >= self.times
        armed = self.after is None or self.after.hits > 0
        return armed and not exhausted and method == self.method and key.startswith(self.key_prefix)


@dataclass(frozen=True)
class _Request:
    head: bytes
    method: str
    key: str
    query: dict[str, str]
    content_length: int | None
    chunked: bool


class S3FaultProxy:
    """Forwards HTTP connections from `port` to `target_port` on 127.0.0.1, with faults."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._rules: list[Rule] = []
        self._held: list[asyncio.Future[bool]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._transports: set[asyncio.WriteTransport] = set()
        self.port = 0
        # (method, key) of every request seen, in arrival order.
        self.requests: list[tuple[str, str]] = []
        # Every object listing seen, in arrival order: its query (prefix, max-keys...).
        self.listings: list[dict[str, str]] = []

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def add(
        self,
        fault: Fault,
        method: str,
        key_prefix: str,
        *,
        after_bytes: int = 0,
        times: int | None = None,
        after: Rule | None = None,
    ) -> Rule:
        rule = Rule(fault, method, key_prefix, after_bytes, times, after)
        self._rules.append(rule)
        return rule

    def clear(self) -> None:
        """Removes every rule; held requests stay held."""
        self._rules.clear()

    def release(self) -> None:
        """Forwards every held request."""
        self._settle_held(True)

    def drop(self) -> None:
        """Cuts the connection of every held request without forwarding it."""
        self._settle_held(False)

    def _settle_held(self, forward: bool) -> None:
        for held in self._held:
            if not held.done():
                held.set_result(forward)
        self._held.clear()

    async def close(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
        # Aborted transports end every connection's task on its own; cancelling them
        # instead would leave asyncio's stream callback reporting the cancellation.
        for transport in list(self._transports):
            transport.abort()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=5)
            for task in stuck:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    def _rule_for(self, method: str, key: str) -> Rule | None:
        for rule in self._rules:
            if rule.matches(method, key):
                rule.hits += 1
                rule.hit.set()
                log.info("s3faults.fault fault=%s method=%s key=%s", rule.fault, method, key)
                return rule
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._transports.add(writer.transport)
        upstream: asyncio.StreamWriter | None = None
        responses: asyncio.Task[None] | None = None
        try:
            up_reader, upstream = await asyncio.open_connection("127.0.0.1", self._target_port)
            self._transports.add(upstream.transport)
            # Set when a rule wants the response cut after this many more bytes.
            cut_after: list[int | None] = [None]
            responses = asyncio.create_task(self._pipe_responses(up_reader, writer, cut_after))
            while (request := await _read_request(reader)) is not None:
                self.requests.append((request.method, request.key))
                if request.method == "GET" and not request.key and "list-type" in request.query:
                    self.listings.append(request.query)
                rule = self._rule_for(request.method, request.key)
                if rule is not None and rule.fault is Fault.STALL:
                    held = asyncio.get_running_loop().create_future()
                    self._held.append(held)
                    if not await held:
                        return
                elif rule is not None and rule.fault is Fault.CUT_REQUEST:
                    upstream.write(request.head)
                    await _forward_body(reader, upstream, request, limit=rule.after_bytes)
                    await upstream.drain()
                    return
                elif rule is not None and rule.fault is Fault.CUT_RESPONSE:
                    cut_after[0] = rule.after_bytes
                elif rule is not None and rule.fault is Fault.REFUSE:
                    await _forward_body(reader, None, request)
                    writer.write(_REFUSAL)
                    await writer.drain()
                    continue
                elif rule is not None and rule.fault is Fault.STRIP_IF_NONE_MATCH:
                    request = _without_header(request, b"if-none-match")
                upstream.write(request.head)
                await _forward_body(reader, upstream, request)
                await upstream.drain()
            await responses
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            if responses is not None:
                responses.cancel()
                await asyncio.gather(responses, return_exceptions=True)
            for side in (writer, upstream):
                if side is not None:
                    side.transport.abort()
                    self._transports.discard(side.transport)
            self._tasks.discard(task)

    async def _pipe_responses(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cut_after: list[int | None],
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(_BUFFER):
                limit = cut_after[0]
                if limit is not None:
                    # A `100 Continue` (the SDK sends PUTs with `Expect:`) is not the
                    # response the rule cuts: it passes whole.
                    interim, data = _split_interim(data)
                    writer.write(interim)
                    if not data:
                        await writer.drain()
                        continue
                if limit is not None and len(data) >= limit:
                    writer.write(data[:limit])
                    await writer.drain()
                    writer.transport.abort()
                    return
                if limit is not None:
                    cut_after[0] = limit - len(data)
                writer.write(data)
                await writer.drain()
            writer.transport.abort()


def _split_interim(data: bytes) -> tuple[bytes, bytes]:
    """(the interim 1xx responses at the start of `data`, the rest)."""
    position = 0
    while data.startswith(b"HTTP/1.1 1", position):
        end = data.find(b"\r\n\r\n", position)
        if end < 0:
            break
        position = end + 4
    return data[:position], data[position:]


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise
        return None
    if len(head) > _MAX_HEAD:
        raise ValueError("request head too large")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    url = urlsplit(target)
    path = unquote(url.path)
    # Path-style: /<bucket>/<key>
    key = path.lstrip("/").partition("/")[2]
    length = headers.get("content-length")
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    query = dict(parse_qsl(url.query, keep_blank_values=True))
    return _Request(head, method, key, query, int(length) if length is not None else None, chunked)


def _without_header(request: _Request, name: bytes) -> _Request:
    lines = request.head.split(b"\r\n")
    kept = [line for line in lines if line.split(b":", 1)[0].strip().lower() != name]
    return replace(request, head=b"\r\n".join(kept))


async def _forward_body(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter | None,
    request: _Request,
    limit: int | None = None,
) -> None:
    """Copies the request's body (to nowhere when `writer` is None); with `limit`,
    only that many bytes of it."""
    budget = [limit]

    def send(data: bytes) -> bool:
        allowed = budget[0]
        if writer is None:
            return True
        if allowed is None:
            writer.write(data)
            return True
        writer.write(data[:allowed])
        left = allowed - min(allowed, len(data))
        budget[0] = left
        return left > 0

    if request.chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if not send(size_line):
                return
            if size == 0:
                # Trailers, then the blank line that ends the body.
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    if not send(line):
                        return
                send(line)
                return
            if not send(await reader.readexactly(size + 2)):
                return
        return
    remaining = request.content_length or 0
    while remaining > 0:
        data = await reader.read(min(_BUFFER, remaining))
        if not data:
            raise asyncio.IncompleteReadError(b"", remaining)
        remaining -= len(data)
        if not send(data):
            return


@asynccontextmanager
async def s3_fault_proxy(target_port: int) -> AsyncIterator[S3FaultProxy]:
    """A running fault proxy to `target_port`, closed when the block exits."""
    proxy = S3FaultProxy(target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.fixture
async def fault_proxy(s3_bucket: S3Bucket) -> AsyncIterator[S3FaultProxy]:
    """A fault proxy in front of the test's bucket."""
    port = urlsplit(s3_bucket.endpoint_url).port
    assert port is not None
    async with s3_fault_proxy(port) as running:
        yield running

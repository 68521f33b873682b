"""Peers that misbehave on purpose, for the abuse tests: a raw HTTP/2 client that sends
what a well-made gRPC client never would, and the peak of this process's RSS while one
runs."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hyperframe.frame
import psutil

from loraserve.common.config.sizes import MESSAGE_LIMIT
from loraserve.testing.waiting import eventually

Headers = Sequence[tuple[str, str]]


def grpc_frame(message: bytes, *, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message."""
    return bytes([int(compressed)]) + len(message).to_bytes(4, "big") + message


def gzip_bomb(decompressed_size: int) -> bytes:
    """A gzip-compressed gRPC message of zeros that inflates to `decompressed_size`."""
    return grpc_frame(gzip.compress(bytes(decompressed_size), 9), compressed=True)


def call_headers(path: str, token: str | None = None, *, encoding: str | None = None) -> Headers:
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "loraserve"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if token is not None:
        headers.append(("authorization", f"Bearer {token}"))
    if encoding is not None:
        headers.append(("grpc-encoding", encoding))
    return headers


@dataclass
class RawPeer:
    """One HTTP/2 connection driven by hand: no validation of what it sends, reading
    only when told (`initial_window` 0: the server may send it no DATA at all)."""

    port: int
    initial_window: int = 65535
    sock: socket.socket = field(init=False)
    conn: h2.connection.H2Connection = field(init=False)
    # Per stream: the grpc-status its trailers carried, or "reset".
    endings: dict[int, str] = field(default_factory=dict, init=False)
    # Streams whose response HEADERS arrived.
    responded: set[int] = field(default_factory=set, init=False)
    # Per stream: the body not yet sent (flow control), and whether END_STREAM follows.
    # A view, not a copy: an attack's bodies are not this process's memory to measure.
    _pending: dict[int, tuple[memoryview, bool]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        config = h2.config.H2Configuration(
            client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.conn = h2.connection.H2Connection(config)
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self.initial_window},
        )
        self.conn.initiate_connection()
        self.flush()

    def open(self, headers: Headers, body: bytes = b"", *, end: bool = True) -> int:
        """Starts a stream; `body` goes out as the server's flow control allows (on this
        and later `read`s), then END_STREAM if `end`."""
        stream = int(self.conn.get_next_available_stream_id())
        self.conn.send_headers(stream, list(headers), end_stream=end and not body)
        if body:
            self._pending[stream] = (memoryview(body), end)
        self._pump()
        return stream

    def open_raw(self, headers: Headers) -> int:
        """Sends a HEADERS frame on a new stream with whatever `headers` say, past the
        checks h2 makes of what a client may send (a `:status`, say)."""
        stream = int(self.conn.get_next_available_stream_id())
        block = self.conn.encoder.encode(list(headers))
        frame = hyperframe.frame.HeadersFrame(stream, block, flags=["END_HEADERS"])
        self.flush()
        self.sock.sendall(frame.serialize())
        self.conn.highest_outbound_stream_id = stream
        return stream

    def _pump(self) -> None:
        for stream, (body, end) in list(self._pending.items()):
            try:
                window = min(len(body), self.conn.local_flow_control_window(stream))
            except h2.exceptions.ProtocolError:
                del self._pending[stream]
                continue
            sent = 0
            while sent < window:
                size = min(window - sent, self.conn.max_outbound_frame_size)
                last = end and sent + size == len(body)
                self.conn.send_data(stream, bytes(body[sent : sent + size]), end_stream=last)
                sent += size
            if sent == len(body):
                del self._pending[stream]
            elif sent:
                self._pending[stream] = (body[sent:], end)
            self.flush()

    def reset(self, stream: int) -> None:
        self.conn.reset_stream(stream, error_code=8)
        self.flush()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def read(self, seconds: float = 0.2) -> bool:
        """Takes in what the server sent within `seconds`; False once it closed."""
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(1 << 20)
        except (TimeoutError, BlockingIOError):
            return True
        except OSError:
            return False
        if not data:
            return False
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            return False
        for event in events:
            if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                self._pending.pop(event.stream_id, None)
            if isinstance(event, h2.events.TrailersReceived):
                status = dict((bytes(k).decode(), bytes(v).decode()) for k, v in event.headers)
                self.endings[event.stream_id] = status.get("grpc-status", "?")
            elif isinstance(event, h2.events.ResponseReceived):
                self.responded.add(event.stream_id)
                status = dict((bytes(k).decode(), bytes(v).decode()) for k, v in event.headers)
                if "grpc-status" in status:
                    self.endings[event.stream_id] = status["grpc-status"]
            elif isinstance(event, h2.events.StreamReset):
                self.endings.setdefault(event.stream_id, "reset")
        self._pump()
        return True

    def ended(self, streams: Sequence[int]) -> bool:
        """Reads for a moment; whether every one of `streams` has ended."""
        self.read(0.1)
        return all(stream in self.endings for stream in streams)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed `sock`, reading (and dropping) whatever it sent first."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


@contextlib.contextmanager
def peak_rss_growth() -> Iterator[list[int]]:
    """Samples this process's RSS every 10 ms inside the block; the list holds the peak
    growth over the RSS at entry, in bytes, once the block exits."""
    process = psutil.Process()
    before = process.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, name="rss-sampler", daemon=True)
    sampler.start()
    growth = [0]
    try:
        yield growth
    finally:
        done.set()
        sampler.join()
        growth[0] = max(peak[0], process.memory_info().rss) - before


async def unfinished_bodies_without_a_token(
    port: int, path: str, meanwhile: Callable[[], Awaitable[None]]
) -> int:
    """Opens 200 calls on `path` with no token, 100 on each of two connections, each
    sending 1 MiB of a message that says it is 16 MiB long and never ending it; waits
    until every one is refused UNAUTHENTICATED and runs `meanwhile` (a normal client)
    beside them. The peak growth of this process's RSS, in bytes."""
    peers = [RawPeer(port, initial_window=1024 * 1024) for _ in range(2)]
    try:
        with peak_rss_growth() as growth:
            body = bytes([0]) + MESSAGE_LIMIT.to_bytes(4, "big") + bytes(1024 * 1024)
            opened = [
                (peer, peer.open(call_headers(path), body, end=False))
                for peer in peers
                for _ in range(100)
            ]

            def refused() -> bool:
                return all(peer.ended([s for p, s in opened if p is peer]) for peer in peers)

            await eventually(lambda: asyncio.to_thread(refused), "every call refused")
            await meanwhile()
        endings = {peer.endings[stream] for peer, stream in opened}
        unauthenticated = str(grpc.StatusCode.UNAUTHENTICATED.value[0])
        assert endings == {unauthenticated}, f"not refused UNAUTHENTICATED: {endings}"
    finally:
        for peer in peers:
            peer.close()
    return growth[0]

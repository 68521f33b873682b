"""HTTP/2 peers without a gRPC library, for the native transport's tests: what no
client library sends, and what one hides (the server's pings, its frames)."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Callable, Iterator

import h2.config
import h2.connection
import h2.events
import hpack

from loraserve.inference.serving import GENERATE_METHOD


@dataclasses.dataclass
class Heard:
    """What a RawClient has heard of a call and its connection."""

    # When each of the server's pings came (time.monotonic()).
    pings: list[float] = dataclasses.field(default_factory=list)
    data: bytes = b""
    trailers: dict[bytes, bytes] = dataclasses.field(default_factory=dict)
    ended: bool = False

    def messages(self) -> list[bytes]:
        """The call's whole messages so far, uncompressed as this server sends them."""
        found, rest = [], self.data
        while len(rest) >= 5 and len(rest) >= 5 + (size := int.from_bytes(rest[1:5], "big")):
            found.append(rest[5 : 5 + size])
            rest = rest[5 + size :]
        return found


class RawClient:
    """An HTTP/2 client without a gRPC library, on a blocking socket: it sends what a
    test says, never resets a stream or keeps a deadline of its own, and grants no flow
    control window beyond HTTP/2's first 64 KiB."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port))
        self._socket.settimeout(60)
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self._h2.initiate_connection()
        self._socket.sendall(self._h2.data_to_send())

    def call(self, path: str, *headers: tuple[str, str], message: bytes = b"\0\0\0\0\0") -> int:
        """Starts a call with `message` as its whole body (an empty request message); its
        stream id."""
        stream = int(self._h2.get_next_available_stream_id())
        self._h2.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
        )
        for start in range(0, len(message), 16384):
            self._h2.send_data(stream, message[start : start + 16384])
        self._h2.end_stream(stream)
        self._socket.sendall(self._h2.data_to_send())
        return stream

    def trailers(self, stream: int) -> dict[bytes, bytes]:
        """Reads until the stream ends; its trailers (or its trailers-only headers)."""
        last: dict[bytes, bytes] = {}
        while True:
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            for event in self._h2.receive_data(data):
                if getattr(event, "stream_id", None) != stream:
                    continue
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    last = dict(event.headers)
                if isinstance(event, h2.events.StreamEnded):
                    return last
            self._socket.sendall(self._h2.data_to_send())

    def listen(self, stream: int, heard: Heard, until: Callable[[Heard], bool]) -> None:
        """Reads into `heard` what the server sends of `stream` and its pings (each
        answered, as h2 does by itself) until `until(heard)` holds; ConnectionError if the
        server closes the connection first."""
        while not until(heard):
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError(f"the server closed the connection, {heard}")
            for event in self._h2.receive_data(data):
                if isinstance(event, h2.events.PingReceived):
                    heard.pings.append(time.monotonic())
                if getattr(event, "stream_id", None) != stream:
                    continue
                if isinstance(event, h2.events.DataReceived):
                    heard.data += event.data
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    heard.trailers = dict(event.headers)
                if isinstance(event, h2.events.StreamEnded):
                    heard.ended = True
            self._socket.sendall(self._h2.data_to_send())

    def read_data(self, stream: int, size: int) -> None:
        """Reads until `size` bytes of the stream's data have come, acknowledging none."""
        received = 0
        while received < size:
            data = self._socket.recv(1 << 16)
            if not data:
                raise ConnectionError("the server closed the connection")
            for event in self._h2.receive_data(data):
                if isinstance(event, h2.events.DataReceived) and event.stream_id == stream:
                    received += len(event.data)
            self._socket.sendall(self._h2.data_to_send())

    def close(self) -> None:
        self._socket.close()


class RawFrames:
    """An HTTP/2 peer that writes frames byte by byte, for what no client library sends:
    floods of frames the server must refuse, or a call after the server's GOAWAY."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY, CONTINUATION = 0x0, 0x1, 0x3, 0x4, 0x7, 0x9
    END_STREAM, END_HEADERS = 0x1, 0x4

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port))
        self._socket.settimeout(30)
        self._socket.sendall(self.PREFACE + self.frame(self.SETTINGS, 0, 0, b""))
        # What was received past the last frame read: the next read goes on from there.
        self._buffer = b""

    @staticmethod
    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (
            len(payload).to_bytes(3, "big")
            + bytes([kind, flags])
            + (stream.to_bytes(4, "big") + payload)
        )

    def send(self, frames: bytes) -> None:
        """Sends `frames`; a server that closed the connection meanwhile is no error."""
        with contextlib.suppress(ConnectionError):
            self._socket.sendall(frames)

    def frames(self) -> Iterator[tuple[int, int, int, bytes]]:
        """The server's frames as (type, flags, stream, payload), from the first not read
        yet until it closes."""
        while True:
            while len(self._buffer) >= 9:
                length = int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) < 9 + length:
                    break
                frame, self._buffer = self._buffer[: 9 + length], self._buffer[9 + length :]
                stream = int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
                yield frame[3], frame[4], stream, frame[9:]
            try:
                data = self._socket.recv(1 << 16)
            except ConnectionError:
                data = b""
            if not data:
                return
            self._buffer += data

    def goaway_code(self) -> int | None:
        """The error code of the GOAWAY the server sends before it closes; None if it
        closes without one."""
        for kind, _, _, payload in self.frames():
            if kind == self.GOAWAY:
                return int.from_bytes(payload[4:8], "big")
        return None

    def reset_code(self, stream: int) -> int | None:
        """The error code the server resets `stream` with; None if the stream ends
        otherwise (trailers) or the connection closes first."""
        for kind, flags, on, payload in self.frames():
            if on == stream and kind == self.RST_STREAM:
                return int.from_bytes(payload, "big")
            if on == stream and kind == self.HEADERS and flags & self.END_STREAM:
                return None
        return None

    def close(self) -> None:
        self._socket.close()


def request_headers(
    *extra: tuple[str, str], path: str = GENERATE_METHOD, encoder: hpack.Encoder | None = None
) -> bytes:
    """A gRPC call's request headers, with `extra`, HPACK-encoded (by `encoder`, for a
    connection whose headers it encoded before)."""
    return (encoder or hpack.Encoder()).encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            *extra,
        ]
    )


def whole_call(stream: int, path: str, encoder: hpack.Encoder) -> bytes:
    """A call's frames: its headers and one empty request message."""
    frame = RawFrames.frame
    headers = request_headers(("te", "trailers"), path=path, encoder=encoder)
    return frame(RawFrames.HEADERS, RawFrames.END_HEADERS, stream, headers) + frame(
        RawFrames.DATA, RawFrames.END_STREAM, stream, b"\0\0\0\0\0"
    )

"""The abuse suite's attacks at full size (`make abuse`), each kept up from a thread of its
own for as long as its block runs, so that a normal client's window falls wholly inside
it. Each counts what it did in its `Tally` (rounds, streams, connections held), which a
test reports beside the figures of `loraserve.testing.attack_figures`."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from loraserve.common.config.sizes import MESSAGE_LIMIT
from loraserve.testing.abuse import Headers, RawPeer, call_headers, closed_by_server, gzip_bomb

Tally = Counter[str]
# What an attack thread runs: until the event is set, counting into the tally.
Work = Callable[[threading.Event, Tally], None]


@asynccontextmanager
async def kept_up(work: Work) -> AsyncIterator[Tally]:
    """Runs `work` in a thread until the block exits, then waits for it to stop; an
    exception the attack raised is raised here."""
    stop = threading.Event()
    tally: Tally = Counter()
    running = asyncio.ensure_future(asyncio.to_thread(work, stop, tally))
    try:
        # A moment for the attack to take hold before the measured window.
        await asyncio.sleep(0.5)
        if running.done():
            running.result()
        yield tally
    finally:
        stop.set()
        await running


def status_headers(port: int, headers: Headers, body: bytes, interval_s: float = 1.0) -> Work:
    """(a) A connection every `interval_s`, each kept open: a call streaming, then on the
    same connection a request HEADERS frame carrying a response's `:status: 103`."""

    def work(stop: threading.Event, tally: Tally) -> None:
        peers: list[RawPeer] = []
        try:
            while not stop.is_set():
                peer = RawPeer(port)
                peers.append(peer)
                stream = peer.open(headers, body)
                while stream not in peer.responded and peer.read(0.05) and not stop.is_set():
                    pass
                peer.open_raw([(":status", "103"), *headers])
                tally["frames"] += 1
                deadline = time.monotonic() + interval_s
                while time.monotonic() < deadline and not stop.is_set():
                    tally["closed_by_server"] = sum(not p.read(0.01) for p in peers)
        finally:
            for peer in peers:
                peer.close()

    return work


def zero_window(port: int, headers: Headers, body: bytes, streams: int = 20) -> Work:
    """(b) One connection whose window is zero, `streams` long calls on it: the server may
    send it nothing, yet it answers pings and SETTINGS as a live client does."""

    def work(stop: threading.Event, tally: Tally) -> None:
        peer = RawPeer(port, initial_window=0)
        try:
            for _ in range(streams):
                peer.open(headers, body)
                tally["streams"] += 1
            while not stop.is_set():
                if not peer.read(0.05):
                    tally["closed_by_server"] += 1
                    return
        finally:
            peer.close()

    return work


def unfinished_bodies(port: int, path: str, streams: int = 200) -> Work:
    """(c) `streams` calls with no token over two connections, each sending 1 MiB of a
    message it says is the message limit long and never ending it."""

    def work(stop: threading.Event, tally: Tally) -> None:
        peers = [RawPeer(port, initial_window=1024 * 1024) for _ in range(2)]
        body = bytes([0]) + MESSAGE_LIMIT.to_bytes(4, "big") + bytes(1024 * 1024)
        try:
            for index in range(streams):
                peers[index % 2].open(call_headers(path), body, end=False)
                tally["streams"] += 1
            while not stop.is_set():
                for peer in peers:
                    peer.read(0.05)
            tally["refused"] = sum(len(peer.endings) for peer in peers)
        finally:
            for peer in peers:
                peer.close()

    return work


def idle_connections(port: int, count: int, source: str = "127.0.0.1") -> Work:
    """(d) `count` TCP connections from `source` (an address of the loopback) that send
    nothing, held until the server closes them or the attack ends."""

    def work(stop: threading.Event, tally: Tally) -> None:
        held = []
        try:
            # A server that closes what it will not serve fills its listen backlog: a
            # connect then waits on SYN retries, so each gets a short timeout.
            for _ in range(count):
                if stop.is_set():
                    break
                try:
                    held.append(_connect(port, source))
                except OSError:
                    tally["not_accepted"] += 1
            tally["opened"] = len(held)
        finally:
            _hold(held, stop, tally)

    return work


def _hold(held: list[socket.socket], stop: threading.Event, tally: Tally) -> None:
    """Holds `held` open until the attack ends; counts those the server closed."""
    try:
        stop.wait()
        tally["closed_by_server"] = sum(closed_by_server(sock) for sock in held)
    finally:
        for sock in held:
            sock.close()


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((source, 0))
        sock.settimeout(2.0)
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


def reset_loop(port: int, headers: Headers, body: bytes) -> Work:
    """(e) Request, the server's response HEADERS, RST_STREAM, again and again on one
    connection (a fresh one when the server closes it, as it may with a GOAWAY)."""

    def work(stop: threading.Event, tally: Tally) -> None:
        peer = RawPeer(port)
        try:
            while not stop.is_set():
                stream = peer.open(headers, body)
                for _ in range(20):
                    if stream in peer.responded or stream in peer.endings:
                        break
                    if not peer.read(0.05):
                        break
                if stream in peer.endings:
                    tally["answered_first"] += 1
                else:
                    peer.reset(stream)
                    tally["resets"] += 1
                if not peer.read(0):
                    tally["closed_by_server"] += 1
                    peer.close()
                    peer = RawPeer(port)
        finally:
            peer.close()

    return work


def gzip_bombs(
    port: int, headers: Headers, count: int = 500, deadline_s: float = 1.0, per_s: int = 50
) -> Work:
    """(f) `count` gzip bombs (each inflating past the message limit), each with a
    deadline of `deadline_s`, `per_s` a second in bursts of 5, then the connection kept
    open."""
    bomb = gzip_bomb(MESSAGE_LIMIT + 1)
    timed = [*headers, ("grpc-timeout", f"{int(deadline_s * 1000)}m")]

    def work(stop: threading.Event, tally: Tally) -> None:
        peer = RawPeer(port)
        try:
            while tally["sent"] < count and not stop.wait(5 / per_s):
                for _ in range(5):
                    peer.open(timed, bomb)
                tally["sent"] += 5
                peer.read(0)
            while not stop.is_set():
                peer.read(0.05)
            tally.update(f"ended_{code}" for code in peer.endings.values())
        finally:
            peer.close()

    return work


def unread_sse(port: int, token: str, body: bytes, streams: int = 16) -> Work:
    """(g) `streams` streamed OpenAI completions whose client reads no byte of the answer
    (a receive buffer of 4 KiB, never drained)."""
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: loraserve\r\n"
        b"Content-Type: application/json\r\n"
        + f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )

    def work(stop: threading.Event, tally: Tally) -> None:
        held: list[socket.socket] = []
        try:
            for _ in range(streams):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.connect(("127.0.0.1", port))
                sock.sendall(request)
                held.append(sock)
                tally["streams"] += 1
        finally:
            _hold(held, stop, tally)

    return work

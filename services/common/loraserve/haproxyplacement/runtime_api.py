"""HAProxy's runtime API (its `stats socket`), as far as placement uses it: a backend's
servers, and the entries of a map.

One command per connection, in the API's non-interactive mode: HAProxy answers and
closes. The Python packages for this API (haproxyadmin, haprapi) are synchronous and
cover neither maps nor HAProxy 2.x's `show servers state`; the protocol is a line in and
text out, so this speaks it directly. Every key and value written is checked first to
be a single word: the socket is at admin level, and a name with a `;` or a newline in it
would be a second command.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from loraserve.common.errors import FailedPrecondition, InvalidArgument, Unavailable

# `show servers state` column values (HAProxy's srv_op_state, srv_admin_state and
# srv_uweight): running, neither in maintenance nor draining, and weighted.
_RUNNING = "2"
_NO_ADMIN_STATE = "0"
_NO_WEIGHT = "0"
# An entry's reference in `show map`, by which one is deleted whatever its key.
_REF = re.compile(r"0x[0-9a-f]{1,16}")
# Map keys and values: HTTP header values HAProxy compares, and server names.
_WORD = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
# What HAProxy answers a map command that did what it was told.
_DONE = ""


@dataclass(frozen=True)
class Server:
    """One `server` line of a backend, as HAProxy sees it now."""

    name: str
    # HOST:PORT (IPv6 hosts in brackets), as a client dials it.
    address: str
    # In the pool: checked up, not in maintenance or drain, weight above 0.
    up: bool


@dataclass(frozen=True)
class MapEntry:
    """One entry of a map in HAProxy's memory."""

    # HAProxy's reference to it (`del map MAP #REF`).
    ref: str
    value: str


class RuntimeApi:
    """Commands to one HAProxy's runtime API at `socket`: a UNIX socket's path, or
    HOST:PORT of a `stats socket ipv4@...` line."""

    def __init__(self, socket: str, timeout_s: float = 5.0) -> None:
        if "/" not in socket:
            host, _, port = socket.rpartition(":")
            if not host or not port.isdigit():
                raise InvalidArgument(
                    f"HAProxy's runtime API must be a socket path or HOST:PORT, got {socket!r}"
                )
        self._socket = socket
        self._timeout_s = timeout_s

    async def command(self, line: str) -> str:
        """The answer to one command; Unavailable when HAProxy cannot be reached."""
        try:
            async with asyncio.timeout(self._timeout_s):
                if "/" in self._socket:
                    reader, writer = await asyncio.open_unix_connection(self._socket)
                else:
                    host, _, port = self._socket.rpartition(":")
                    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
                try:
                    writer.write(line.encode() + b"\n")
                    await writer.drain()
                    return (await reader.read()).decode(errors="replace")
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            raise Unavailable(f"HAProxy's runtime API at {self._socket}: {exc}") from exc

    async def servers(self, backend: str) -> list[Server]:
        """The servers of `backend`, in its order."""
        answer = await self.command(f"show servers state {_word(backend)}")
        lines = answer.splitlines()
        header = next((line for line in lines if line.startswith("# be_id")), None)
        if header is None:
            raise FailedPrecondition(f"HAProxy has no backend {backend!r}: {answer.strip()}")
        columns = header.removeprefix("# ").split()
        servers = []
        for line in lines:
            if not line or line.startswith("#") or " " not in line:
                continue
            row = dict(zip(columns, line.split(), strict=False))
            try:
                host, port = row["srv_addr"], row["srv_port"]
                up = (
                    row["srv_op_state"] == _RUNNING
                    and row["srv_admin_state"] == _NO_ADMIN_STATE
                    and row["srv_uweight"] != _NO_WEIGHT
                )
                name = row["srv_name"]
            except KeyError as exc:
                raise FailedPrecondition(
                    f"HAProxy's `show servers state` has no column {exc}: {header}"
                ) from exc
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            servers.append(Server(name=name, address=address, up=up))
        return servers

    async def map_entries(self, map_file: str) -> dict[str, MapEntry]:
        """The entries of the map HAProxy loaded from `map_file`, by key; a line that is
        not one key and one value (a value with spaces, written by someone else) is
        left out."""
        answer = await self.command(f"show map {_word_path(map_file)}")
        if answer.startswith("Unknown map"):
            raise FailedPrecondition(f"HAProxy has no map {map_file}: {answer.strip()}")
        entries: dict[str, MapEntry] = {}
        for line in answer.splitlines():
            fields = line.split()
            if len(fields) == 3 and _REF.fullmatch(fields[0]):
                entries[fields[1]] = MapEntry(fields[0], fields[2])
        return entries

    async def set_entry(self, map_file: str, key: str, value: str, *, new: bool) -> None:
        """Adds (`new`) or changes one entry."""
        verb = "add" if new else "set"
        await self._map_command(f"{verb} map {_word_path(map_file)} {_word(key)} {_word(value)}")

    async def delete_entry(self, map_file: str, entry: MapEntry) -> None:
        """Deletes one entry by its reference: whatever its key, no key is sent."""
        if not _REF.fullmatch(entry.ref):
            raise InvalidArgument(f"not a map entry reference: {entry.ref!r}")
        await self._map_command(f"del map {_word_path(map_file)} #{entry.ref}")

    async def _map_command(self, line: str) -> None:
        answer = (await self.command(line)).strip()
        if answer != _DONE:
            raise FailedPrecondition(f"HAProxy refused `{line}`: {answer}")


def _word(text: str) -> str:
    if not _WORD.fullmatch(text):
        raise InvalidArgument(f"not a name HAProxy's runtime API may be given: {text!r}")
    return text


def _word_path(path: str) -> str:
    if not path or any(c.isspace() or c == ";" for c in path):
        raise InvalidArgument(f"not a map path HAProxy's runtime API may be given: {path!r}")
    return path

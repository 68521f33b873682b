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

# `show servers state` column values (HAProxy's srv_op_state and srv_admin_state).
_RUNNING = "2"
_NO_ADMIN_STATE = "0"
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
    # In the pool: checked up and not in maintenance or drain.
    up: bool


class RuntimeApi:
    """Commands to one HAProxy's runtime API at `socket`: a UNIX socket's path, or
    HOST:PORT of a `stats socket ipv4@...` line."""

    def __init__(self, socket: str, timeout_s: float = 5.0) -> None:
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
                    return (await reader.read()).decode()
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
            host, port = row["srv_addr"], row["srv_port"]
            servers.append(
                Server(
                    name=row["srv_name"],
                    address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                    up=row["srv_op_state"] == _RUNNING
                    and row["srv_admin_state"] == _NO_ADMIN_STATE,
                )
            )
        return servers

    async def map_entries(self, map_file: str) -> dict[str, str]:
        """The entries of the map HAProxy loaded from `map_file`."""
        answer = await self.command(f"show map {_word_path(map_file)}")
        entries: dict[str, str] = {}
        for line in answer.splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[0].startswith("0x"):
                entries[fields[1]] = fields[2]
            elif fields:
                raise FailedPrecondition(f"HAProxy has no map {map_file}: {answer.strip()}")
        return entries

    async def set_entry(self, map_file: str, key: str, value: str, *, new: bool) -> None:
        """Adds (`new`) or changes one entry."""
        verb = "add" if new else "set"
        await self._map_command(f"{verb} map {_word_path(map_file)} {_word(key)} {_word(value)}")

    async def delete_entry(self, map_file: str, key: str) -> None:
        await self._map_command(f"del map {_word_path(map_file)} {_word(key)}")

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

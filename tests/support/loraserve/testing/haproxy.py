"""HAProxy (the real binary, Debian's package) as a child process a test routes through.

The test runs `deploy/haproxy/haproxy.cfg` itself, rewritten only where a test must
differ from a deployment: the address it listens on, its stats port, its admin socket,
its placement map's path and its `server` lines, with `haproxy-placement` beside it as
a deployment runs it. Its runtime API (the admin socket) says which replicas are in the
pool, where the adapters are placed, and points a server line at a replica that came
back elsewhere.

Where `haproxy` is not installed the tests are skipped, saying so, except under
`.ci/run` as root, where `make haproxy` should have installed it: there they fail.
"""

from __future__ import annotations

import asyncio
import csv
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from loraserve.common.errors import Unavailable
from loraserve.haproxyplacement import RuntimeApi
from loraserve.testing.processes.services import ChildProcess, free_port
from loraserve.testing.waiting import eventually

MISSING = "haproxy not installed: run make haproxy"
# Debian puts it in /usr/sbin, which a user's PATH may leave out.
BINARY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
# Where `.ci/run` installed it (as root, with apt-get) it says so: a missing binary is
# then a failed install, not a machine without it.
INSTALLS_IN_CI = os.environ.get("LORASERVE_REQUIRE_HAPROXY") == "1"

haproxy_only = pytest.mark.skipif(BINARY is None and not INSTALLS_IN_CI, reason=MISSING)

# The deploy file's sections this rewrites.
FRONTEND = "frontend inference"
STATS = "frontend stats"
BACKEND = "backend replicas"
BACKEND_NAME = BACKEND.split()[1]
# Where the deploy file has HAProxy read the placement map, and the empty file shipped.
PLACEMENT_MAP = "/etc/haproxy/placement.map"
_SECTION = re.compile(r"^(global|defaults|frontend|backend|listen)\b")
_BIND = re.compile(r"^(\s+bind\s+)\S+(.*)$")
_SOCKET = re.compile(r"^(\s+stats socket\s+)\S+(.*)$")
_SERVER = re.compile(r"^(\s+)server\s")
# A Generate call in the log (`option httplog`, the adapter header captured in braces).
_GENERATE_LOGGED = re.compile(
    rf" {BACKEND_NAME}/(?P<server>\S+) .*\{{(?P<adapter>[^}}]*)\}} \"POST \S*/Generate "
)
# Guards against a hang only.
START_GUARD_S = 30.0


def binary() -> str:
    """The haproxy binary; fails the test where it is missing (the marker skips first
    wherever a missing one is allowed)."""
    if BINARY is None:
        pytest.fail(MISSING)
    return BINARY


def render(
    template: str,
    *,
    listen: str,
    stats: str,
    admin_socket: Path,
    placement_map: Path,
    servers: Mapping[str, str],
) -> str:
    """`template` (the deploy file) with the frontends bound to `listen` and `stats`, the
    admin socket at `admin_socket`, the placement map read from `placement_map` and one
    server line per name and HOST:PORT of `servers` in place of its own; raises if any of
    those is not where it should be."""
    out: list[str] = []
    done: dict[str, int] = {}
    section = ""
    for line in template.splitlines():
        if _SECTION.match(line):
            section = line.strip()
        if section == BACKEND and PLACEMENT_MAP in line:
            line = line.replace(PLACEMENT_MAP, str(placement_map))
            done["map"] = done.get("map", 0) + 1
        server = _SERVER.match(line) if section == BACKEND else None
        if server is not None:
            if "servers" not in done:
                indent = server.group(1)
                out += [f"{indent}server {name} {address}" for name, address in servers.items()]
            done["servers"] = done.get("servers", 0) + 1
            continue
        replaced = _rewrite(section, line, listen, stats, admin_socket)
        if replaced is not None:
            done[section] = done.get(section, 0) + 1
            line = replaced
        out.append(line)
    expected = {"global": 1, FRONTEND: 1, STATS: 1, "map": 1}
    if {key: done.get(key, 0) for key in expected} != expected or not done.get("servers"):
        raise ValueError(f"the HAProxy config is not laid out as expected: rewrote {done}")
    return "\n".join(out) + "\n"


def _rewrite(section: str, line: str, listen: str, stats: str, admin_socket: Path) -> str | None:
    """The line rewritten for a test, or None where it stays."""
    if section == "global":
        pattern, value = _SOCKET, str(admin_socket)
    elif section in (FRONTEND, STATS):
        pattern, value = _BIND, listen if section == FRONTEND else stats
    else:
        return None
    found = pattern.match(line)
    return f"{found.group(1)}{value}{found.group(2)}" if found else None


@dataclass
class Haproxy(ChildProcess):
    """A running HAProxy: clients dial `address`; `admin_socket` is its runtime API."""

    address: str
    admin_socket: Path
    placement_map: Path

    async def command(self, line: str) -> str:
        """One runtime API command's answer."""
        return await RuntimeApi(str(self.admin_socket)).command(line)

    def served(self, logged_from: int = 0) -> dict[str, list[str]]:
        """Adapter -> the server of each of its Generate calls HAProxy logged past byte
        `logged_from` of its log (a line per call, as it ends), in order."""
        with self.log_path.open("rb") as log_file:
            log_file.seek(logged_from)
            text = log_file.read().decode(errors="replace")
        served: dict[str, list[str]] = {}
        for found in _GENERATE_LOGGED.finditer(text):
            served.setdefault(found["adapter"], []).append(found["server"])
        return served

    async def placement(self) -> dict[str, str]:
        """Adapter -> server, as haproxy-placement last wrote it."""
        entries = await RuntimeApi(str(self.admin_socket)).map_entries(str(self.placement_map))
        return {adapter: entry.value for adapter, entry in entries.items()}

    async def servers(self) -> dict[str, dict[str, str]]:
        """Each server's row of `show stat`: its "status" ("UP", "DOWN", "UP 1/3", ...),
        "check_status" (L7OK, L7STS, L4CON, ...), "scur" (requests in flight), ..."""
        text = (await self.command("show stat")).removeprefix("# ")
        return {
            row["svname"]: row
            for row in csv.DictReader(text.splitlines())
            if row["pxname"] == BACKEND_NAME and row["svname"] != "BACKEND"
        }

    async def in_pool(self, server: str) -> bool:
        """Whether `server` gets requests: UP, and not on its way down."""
        return (await self.servers())[server]["status"] == "UP"

    async def out_of_pool(self, server: str) -> bool:
        """Whether `server` gets no requests (DOWN, or DOWN on its way up)."""
        return (await self.servers())[server]["status"].startswith("DOWN")

    async def move(self, server: str, address: str) -> None:
        """Points `server`'s line at HOST:PORT `address` (a replica that came back there)."""
        host, _, port = address.rpartition(":")
        answer = await self.command(f"set server {BACKEND_NAME}/{server} addr {host} port {port}")
        if "changed" not in answer:
            raise AssertionError(f"HAProxy did not move {server} to {address}: {answer}")


@asynccontextmanager
async def running_haproxy(
    config: Path, directory: Path, servers: Mapping[str, str], *, placement: bool = True
) -> AsyncIterator[Haproxy]:
    """HAProxy on `config` (the deploy file) in front of `servers` (name: HOST:PORT),
    answering on its admin socket before the block runs, with `haproxy-placement`
    beside it unless `placement` is False; both killed when it exits."""
    path, listen, admin, placement_map = _write_config(config, directory, servers)
    haproxy = binary()
    checked = await asyncio.create_subprocess_exec(
        haproxy,
        "-c",
        "-f",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    said, _ = await checked.communicate()
    if checked.returncode != 0:
        raise AssertionError(f"haproxy -c refused {path}:\n{said.decode()}")
    running = Haproxy(
        await _child(directory / "haproxy.log", haproxy, "-db", "-f", str(path)),
        directory / "haproxy.log",
        listen,
        admin,
        placement_map,
    )
    agent: ChildProcess | None = None
    try:
        await eventually(
            lambda: _answers(running), "HAProxy answers on its admin socket", START_GUARD_S
        )
        if placement:
            agent_log = directory / "haproxy-placement.log"
            agent = ChildProcess(
                await _child(
                    agent_log,
                    sys.executable,
                    *("-m", "loraserve.haproxyplacement"),
                    *("--haproxy-socket", str(admin), "--map", str(placement_map)),
                    *("--backend", BACKEND_NAME),
                ),
                agent_log,
            )
        yield running
    finally:
        if agent is not None:
            await agent.kill_group()
        await running.kill_group()


async def _child(log_path: Path, *argv: str) -> asyncio.subprocess.Process:
    with log_path.open("ab") as log_file:
        return await asyncio.create_subprocess_exec(
            *argv, stdout=log_file, stderr=log_file, start_new_session=True
        )


def _write_config(
    config: Path, directory: Path, servers: Mapping[str, str]
) -> tuple[Path, str, Path, Path]:
    """The test's config beside its other files: its path, listen address, admin socket
    and placement map (a copy of the deploy file's)."""
    directory.mkdir(parents=True, exist_ok=True)
    path, admin = directory / "haproxy.cfg", directory / "admin.sock"
    placement_map = directory / "placement.map"
    shutil.copyfile(config.parent / Path(PLACEMENT_MAP).name, placement_map)
    listen, stats = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    text = render(
        config.read_text(),
        listen=listen,
        stats=stats,
        admin_socket=admin,
        placement_map=placement_map,
        servers=servers,
    )
    path.write_text(text)
    return path, listen, admin, placement_map


async def _answers(haproxy: Haproxy) -> bool:
    if haproxy.process.returncode is not None:
        raise AssertionError(
            f"haproxy exited with {haproxy.process.returncode}:\n{haproxy.log_text()}"
        )
    try:
        await haproxy.command("show info")
    except Unavailable:
        return False
    return True

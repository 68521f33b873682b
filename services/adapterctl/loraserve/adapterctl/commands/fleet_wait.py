"""`--wait` of push and rollback: until the inference replicas report a revision.

The store's `GetAdapterStatus` lists every live replica with each revision it routes
and that revision's state. A replica has answered once it reports the revision
ROUTED or LOADED (an ACK) or FAILED (a NACK, with its reason), or once it has
applied the change's seq and routes a newer revision (the revision was superseded,
which is no failure of it). `--wait all` waits for every replica live when the wait
began (stale ones, which missed two reports, are named and not waited for);
`--wait N` for N ACKs from those same replicas. It ends as soon as the outcome is
known: all answered, N ACKs, or too many NACKs for N.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from loraserve.adapterctl.fleet_wait_args import parse_wanted
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import dumps, status_code_name
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.store import pages

# Between two looks at the statuses: replicas report within about a second.
POLL_S = 0.25
DEFAULT_WAIT_TIMEOUT_S = 120.0
_ACKED_STATES = frozenset({pb.REVISION_SERVING_STATE_ROUTED, pb.REVISION_SERVING_STATE_LOADED})


@dataclass
class WaitOutcome:
    """Who answered what about `revision` (replica ids, in order)."""

    revision: int
    acked: list[str] = field(default_factory=list)
    # (replica, reason)
    nacked: list[tuple[str, str]] = field(default_factory=list)
    # Replicas waited for that did not answer in time.
    missing: list[str] = field(default_factory=list)
    # Stale replicas, not waited for.
    stale: list[str] = field(default_factory=list)
    timed_out: bool = False

    def ok(self, wanted: int | None) -> bool:
        """Every replica waited for serves it, or at least `wanted` do."""
        if wanted is None:
            return not self.nacked and not self.missing
        return len(self.acked) >= wanted

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "acked": self.acked,
            "nacked": [{"replica_id": r, "reason": why} for r, why in self.nacked],
            "missing": self.missing,
            "stale": self.stale,
        }


async def statuses_of(stub: Any, name: str, timeout_s: float) -> list[pb.ReplicaAdapterStatus]:
    request = pb.GetAdapterStatusRequest(name=name)
    found: list[pb.ReplicaAdapterStatus] = []
    async for page in pages(stub.GetAdapterStatus, request, timeout_s):
        found.extend(page.statuses)
    return found


def answer(status: pb.ReplicaAdapterStatus, revision: int, seq: int) -> tuple[str, str] | None:
    """("ack" | "nack", reason) once the replica has answered about the revision; with
    revision 0, once it has applied `seq` (a rollout's weight, promote or abort)."""
    if not revision:
        return ("ack", "") if status.applied_seq >= seq else None
    for reported in status.revisions:
        if reported.revision != revision:
            continue
        if reported.state in _ACKED_STATES:
            return "ack", ""
        if reported.state == pb.REVISION_SERVING_STATE_FAILED:
            code = status_code_name(reported.error.code)
            return "nack", f"{code}: {reported.error.message}"
    if status.applied_seq >= seq and status.serving_revision > revision:
        return "ack", f"superseded by @{status.serving_revision}"
    return None


async def wait_for_replicas(
    stub: Any,
    name: str,
    revision: int,
    seq: int,
    wanted: int | None,
    timeout_s: float,
    call_timeout_s: float,
) -> WaitOutcome:
    """Waits until the replicas answered about `name`@`revision`, committed at `seq`."""
    deadline = time.monotonic() + timeout_s
    outcome = WaitOutcome(revision)
    first = await statuses_of(stub, name, call_timeout_s)
    waited = {s.replica_id for s in first if s.liveness == pb.REPLICA_LIVENESS_LIVE}
    outcome.stale = sorted(s.replica_id for s in first if s.replica_id not in waited)
    while True:
        statuses = first or await statuses_of(stub, name, call_timeout_s)
        first = []
        # Only replicas live when the wait began count: one that appears later proves
        # nothing about the fleet the caller asked about.
        answers = {
            s.replica_id: answer(s, revision, seq) for s in statuses if s.replica_id in waited
        }
        outcome.acked = sorted(r for r, a in answers.items() if a and a[0] == "ack")
        outcome.nacked = sorted((r, a[1]) for r, a in answers.items() if a and a[0] == "nack")
        pending = sorted(r for r in waited if answers.get(r) is None)
        if _decided(outcome, wanted, len(pending), len(waited)):
            return outcome
        if time.monotonic() >= deadline:
            outcome.missing = pending
            outcome.timed_out = True
            return outcome
        await asyncio.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def _decided(outcome: WaitOutcome, wanted: int | None, pending: int, waited: int) -> bool:
    if wanted is None:
        return pending == 0
    acked = len(outcome.acked)
    return acked >= wanted or waited - len(outcome.nacked) < wanted


def describe(outcome: WaitOutcome, name: str, wanted: int | None) -> list[str]:
    """Lines for stderr: who did not serve the revision, and why."""
    ref = f"{name}@{outcome.revision}" if outcome.revision else name
    lines = [f"replica {r} refused {ref}: {why}" for r, why in outcome.nacked]
    lines += [f"replica {r} did not report {ref} in time" for r in outcome.missing]
    if wanted is not None and len(outcome.acked) < wanted and not outcome.missing:
        lines.append(f"only {len(outcome.acked)} of the {wanted} replicas asked for serve {ref}")
    lines += [f"replica {r} is stale (missed its reports): not waited for" for r in outcome.stale]
    if outcome.ok(wanted):
        lines.insert(0, f"{len(outcome.acked)} replica(s) serve {ref}")
    return lines


async def wait_and_report(
    stub: Any,
    settings: CtlSettings,
    console: Console,
    name: str,
    target: tuple[int, int],
    wait: str,
    result: dict[str, Any] | None,
) -> int:
    """Waits for the replicas about `target` (revision, seq; revision 0: the seq
    alone), writes what they answered to stderr (with `--json`, `result` with a
    "replicas" member to stdout) and returns the exit code: 0 when they serve it, 1
    when one refused it, 3 when some did not answer in time."""
    revision, seq = target
    wanted = parse_wanted(wait)
    timeout = settings.timeout_s or DEFAULT_WAIT_TIMEOUT_S
    outcome = await wait_for_replicas(
        stub, name, revision, seq, wanted, timeout, settings.unary_timeout_s
    )
    for line in describe(outcome, name, wanted):
        console.err(line)
    if settings.json and result is not None:
        console.out(dumps({**result, "replicas": outcome.to_json()}))
    if outcome.ok(wanted):
        return EXIT_OK
    return EXIT_FAILED if outcome.nacked else EXIT_UNREACHABLE

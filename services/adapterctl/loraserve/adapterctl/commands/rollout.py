"""`adapterctl rollout`: canary rollouts of an adapter revision.

start, set, promote and abort are writes with one idempotency key per invocation (as
rollback's), retried by gRPC's policy on UNAVAILABLE; each prints the rollout after
the change and, with `--wait`, waits for the replicas (fleet_wait.py): `start` until
they route the candidate (or refuse it), the others until they have applied the
change's seq, after which every replica splits as it says.
"""

from __future__ import annotations

import argparse
from typing import Any

from loraserve.adapterctl.commands.fleet_wait import wait_and_report
from loraserve.adapterctl.commands.push import validated_name
from loraserve.adapterctl.connection import connect_store
from loraserve.adapterctl.failures import EXIT_OK
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import dumps, format_time, message_to_json, table
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.push import new_idempotency_key


async def cmd_rollout_start(
    args: argparse.Namespace, settings: CtlSettings, console: Console
) -> int:
    guards = pb.RolloutGuards(
        abort_on_nack=args.abort_on_nack,
        window_seconds=args.window,
        min_requests=args.min_requests,
        min_callers=args.min_callers,
    )
    if args.max_error_rate_margin is not None:
        guards.max_error_rate_margin = args.max_error_rate_margin
    if args.max_ttft_p95_margin is not None:
        guards.max_ttft_p95_margin = args.max_ttft_p95_margin
    request = pb.StartRolloutRequest(
        name=validated_name(args.name),
        revision=args.revision,
        weight=args.weight,
        guards=guards,
        idempotency_key=new_idempotency_key(),
    )
    return await _change(args, settings, console, "StartRollout", request)


async def cmd_rollout_set(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    request = pb.SetRolloutWeightRequest(
        name=validated_name(args.name), weight=args.weight, idempotency_key=new_idempotency_key()
    )
    return await _change(args, settings, console, "SetRolloutWeight", request)


async def cmd_rollout_promote(
    args: argparse.Namespace, settings: CtlSettings, console: Console
) -> int:
    request = pb.PromoteRolloutRequest(
        name=validated_name(args.name),
        idempotency_key=new_idempotency_key(),
        expected_candidate_revision=args.expect,
        force=args.force,
    )
    return await _change(args, settings, console, "PromoteRollout", request)


async def cmd_rollout_abort(
    args: argparse.Namespace, settings: CtlSettings, console: Console
) -> int:
    request = pb.AbortRolloutRequest(
        name=validated_name(args.name), reason=args.reason, idempotency_key=new_idempotency_key()
    )
    return await _change(args, settings, console, "AbortRollout", request)


async def _change(
    args: argparse.Namespace, settings: CtlSettings, console: Console, method: str, request: Any
) -> int:
    async with connect_store(settings) as stub:
        response: pb.RolloutResponse = await getattr(stub, method)(
            request, timeout=settings.unary_timeout_s
        )
        rollout = response.rollout
        if not settings.json:
            console.out(f"{describe(rollout)} (seq {response.seq})")
        if args.wait is not None:
            # A start waits for the candidate to be routed (or refused); the others for
            # the change's seq to be applied.
            revision = rollout.candidate_revision if method == "StartRollout" else 0
            target = (revision, response.seq)
            result = message_to_json(response)
            return await wait_and_report(
                stub, settings, console, rollout.adapter_name, target, args.wait, result
            )
    if settings.json:
        console.out(dumps(message_to_json(response)))
    return EXIT_OK


async def cmd_rollout_status(
    args: argparse.Namespace, settings: CtlSettings, console: Console
) -> int:
    name = validated_name(args.name)
    async with connect_store(settings) as stub:
        response: pb.GetRolloutResponse = await stub.GetRollout(
            pb.GetRolloutRequest(name=name), timeout=settings.unary_timeout_s
        )
    if settings.json:
        console.out(dumps(message_to_json(response)))
        return EXIT_OK
    rollout = response.rollout
    lines = [
        f"{describe(rollout)}, started at seq {rollout.start_seq} by {rollout.started_by} "
        f"{format_time(rollout.start_time)}",
        f"guards: {_guards_text(rollout.guards)}",
    ]
    if rollout.state != pb.ROLLOUT_STATE_ACTIVE:
        lines.append(
            f"{_state(rollout)} at seq {rollout.update_seq} by {rollout.updated_by} "
            f"{format_time(rollout.update_time)}"
            + (f": {rollout.end_reason}" if rollout.end_reason else "")
        )
    for line in lines:
        console.out(line)
    if response.figures:
        arms = ("current", "candidate")
        rows = [(arm, *_figures_row(f)) for arm, f in zip(arms, response.figures, strict=False)]
        rows += [
            (f"  {r.replica_id}", *_figures_row(r.figures)) for r in response.candidate_by_replica
        ]
        headers = (
            "ARM", "REVISION", "REQUESTS", "CALLERS", "ERRORS", "ERROR RATE", "TTFT P95",
            "TOKENS",
        )  # fmt: skip
        console.out(table(headers, rows), multiline=True)
        when = "when it ended" if rollout.state != pb.ROLLOUT_STATE_ACTIVE else "so far"
        window = rollout.guards.window_seconds
        console.out(
            f"figures over the last {window:g} s, {when} ({format_time(response.figures_time)})"
        )
    else:
        console.out("no figures yet: replicas report them every --rollout-report-interval")
    return EXIT_OK


def describe(rollout: pb.Rollout) -> str:
    """E.g. `rollout of alpha@4 from @3: active, 20 % to the candidate`."""
    return (
        f"rollout of {rollout.adapter_name}@{rollout.candidate_revision} from "
        f"@{rollout.current_revision}: {_state(rollout)}, {rollout.weight:g} % to the candidate"
    )


def _state(rollout: pb.Rollout) -> str:
    return pb.RolloutState.Name(rollout.state).removeprefix("ROLLOUT_STATE_").lower()


def _guards_text(guards: pb.RolloutGuards) -> str:
    parts = ["abort on NACK" if guards.abort_on_nack else "NACKs ignored"]
    if guards.HasField("max_error_rate_margin"):
        parts.append(f"error rate margin {guards.max_error_rate_margin:g} percentage points")
    if guards.HasField("max_ttft_p95_margin"):
        parts.append(f"TTFT p95 margin {guards.max_ttft_p95_margin:g} %")
    parts.append(
        f"window {guards.window_seconds:g} s, at least {guards.min_requests} requests from "
        f"{guards.min_callers} callers"
    )
    return "; ".join(parts)


def _figures_row(figures: pb.ArmFigures) -> tuple[object, ...]:
    return (
        figures.revision,
        figures.requests,
        figures.callers,
        figures.errors,
        f"{100 * figures.error_rate:.1f} %",
        f"{1000 * figures.ttft_p95_seconds:.0f} ms",
        figures.generated_tokens,
    )

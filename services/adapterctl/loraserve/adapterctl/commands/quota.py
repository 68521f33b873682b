"""`adapterctl quota`: set, clear and show per-adapter quotas.

set and clear are writes with one idempotency key per invocation, retried by gRPC's
policy on UNAVAILABLE; each is one entry in the store's change log, which every
inference replica applies at the same seq. The limits are checked here first against
their ranges (common.quota.LIMIT_RANGES; exit 2, nothing sent), and again by the store.
"""

from __future__ import annotations

import argparse

from loraserve.adapterctl.commands.push import validated_name
from loraserve.adapterctl.connection import connect_store
from loraserve.adapterctl.failures import EXIT_OK, UsageError
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import dumps, message_to_json, table
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.push import new_idempotency_key
from loraserve.common.quota import Quota, limit_problem, quota_from_proto, quota_to_proto


async def cmd_quota_set(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = _target(args)
    quota = _limits(args)
    request = pb.SetQuotaRequest(
        adapter_name=name, quota=quota_to_proto(quota), idempotency_key=new_idempotency_key()
    )
    return await _change(settings, console, request, f"{_who(name)}: {quota.describe()}")


async def cmd_quota_clear(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = _target(args)
    request = pb.SetQuotaRequest(adapter_name=name, idempotency_key=new_idempotency_key())
    return await _change(settings, console, request, f"{_who(name)}: no quota")


async def cmd_quota_show(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = validated_name(args.name) if args.name else ""
    async with connect_store(settings) as stub:
        response: pb.ListQuotasResponse = await stub.ListQuotas(
            pb.ListQuotasRequest(), timeout=settings.unary_timeout_s
        )
    if name:
        own = [q for q in response.quotas if q.adapter_name == name]
        del response.quotas[:]
        response.quotas.extend(own)
    if settings.json:
        console.out(dumps(message_to_json(response)))
        return EXIT_OK
    default = (
        quota_from_proto(response.default_quota).describe()
        if response.HasField("default_quota")
        else "none"
    )
    rows = [("(default)", default)]
    rows += [(q.adapter_name, quota_from_proto(q.quota).describe()) for q in response.quotas]
    if name and not response.quotas:
        rows.append((name, "the default"))
    console.out(table(("ADAPTER", "QUOTA PER REPLICA"), rows), multiline=True)
    console.out(f"as of seq {response.seq}")
    return EXIT_OK


def _limits(args: argparse.Namespace) -> Quota:
    limits = (
        ("max_in_flight", args.max_in_flight),
        ("tokens_per_second", args.tokens_per_second),
        ("tokens_per_minute", args.tokens_per_minute),
    )
    for name, value in limits:
        problem = None if value is None else limit_problem(name, value)
        if problem is not None:
            raise UsageError(f"--{name.replace('_', '-')} {problem}")
    if all(value is None for _, value in limits):
        raise UsageError(
            "give at least one limit: --max-in-flight, --tokens-per-second or "
            "--tokens-per-minute ('quota clear' lifts them)"
        )
    return Quota(args.max_in_flight, args.tokens_per_second, args.tokens_per_minute)


def _target(args: argparse.Namespace) -> str:
    """The adapter named, or "" (the default quota) with --default; not both."""
    if args.default and args.name:
        raise UsageError("give NAME or --default, not both")
    if not args.default and not args.name:
        raise UsageError("give the adapter NAME, or --default for the default quota")
    return "" if args.default else validated_name(args.name)


def _who(name: str) -> str:
    return f"quota of {name}" if name else "default quota"


async def _change(
    settings: CtlSettings, console: Console, request: pb.SetQuotaRequest, what: str
) -> int:
    async with connect_store(settings) as stub:
        response: pb.SetQuotaResponse = await stub.SetQuota(
            request, timeout=settings.unary_timeout_s
        )
    if settings.json:
        console.out(dumps(message_to_json(response)))
    else:
        console.out(f"{what} (seq {response.seq})")
    return EXIT_OK

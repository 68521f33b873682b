"""The commands that read the store: list, revisions, status, watch."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from typing import Any

import grpc

from loraserve.adapterctl.commands.push import validated_name
from loraserve.adapterctl.connection import connect_store
from loraserve.adapterctl.failures import EXIT_OK
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import (
    dumps,
    format_size,
    format_time,
    message_to_json,
    status_code_name,
    table,
)
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.store import pages
from loraserve.common.quota import quota_from_proto

_PAGE_SIZE = 1000


async def cmd_list(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    adapters: list[pb.Adapter] = []
    seq = None
    request = pb.ListAdaptersRequest(page_size=_PAGE_SIZE, base_model=args.base_model or "")
    async with connect_store(settings) as stub:
        async for page in pages(stub.ListAdapters, request, settings.unary_timeout_s):
            seq = page.seq if seq is None else seq
            adapters.extend(page.adapters)
    if settings.json:
        console.out(dumps({"adapters": [message_to_json(a) for a in adapters], "seq": seq}))
        return EXIT_OK
    rows = [
        (
            a.name,
            a.current_revision or "-",
            a.latest_revision,
            a.current.rank if a.HasField("current") else "",
            a.current.base_model if a.HasField("current") else "",
            format_time(a.update_time),
        )
        for a in adapters
    ]
    console.out(
        table(("NAME", "CURRENT", "LATEST", "RANK", "BASE MODEL", "UPDATED"), rows), multiline=True
    )
    return EXIT_OK


async def cmd_revisions(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = validated_name(args.name)
    revisions: list[pb.Revision] = []
    yanks: dict[int, pb.RevisionYank] = {}
    current = 0
    request = pb.ListRevisionsRequest(name=name, page_size=_PAGE_SIZE)
    async with connect_store(settings) as stub:
        async for page in pages(stub.ListRevisions, request, settings.unary_timeout_s):
            if not revisions:
                current = page.current_revision
            revisions.extend(page.revisions)
            yanks.update((y.revision, y) for y in page.yanks)
    if settings.json:
        console.out(
            dumps(
                {
                    "name": name,
                    "current_revision": current,
                    "revisions": [message_to_json(r) for r in revisions],
                    "yanks": [message_to_json(y) for y in yanks.values()],
                }
            )
        )
        return EXIT_OK
    rows = [
        (
            f"{r.revision}{' *' if r.revision == current else ''}"
            + (" yanked" if r.revision in yanks else ""),
            format_time(r.create_time),
            r.pushed_by,
            signer_text(r),
            format_size(sum(f.size for f in r.files)),
            r.rank,
            _yank_text(yanks[r.revision]) if r.revision in yanks else _description_text(r),
        )
        for r in revisions
    ]
    headers = ("REVISION", "CREATED", "PUSHED BY", "SIGNED BY", "SIZE", "RANK", "DESCRIPTION")
    console.out(table(headers, rows), multiline=True)
    return EXIT_OK


def signer_text(revision: pb.Revision) -> str:
    """Who the store verified had signed the revision; `unverified` for a signature
    it did not check (signature policy off, or warn and it failed); `withheld` for one
    the store holds over its limit and serves without (replicas count it unsigned)."""
    if revision.signed_by:
        return revision.signed_by
    if "signature" in revision.withheld_fields:
        return "withheld"
    return "unverified" if revision.signature else "unsigned"


def _yank_text(yank: pb.RevisionYank) -> str:
    return f"[yanked by {yank.yanked_by}: {yank.reason}]"


def _description_text(revision: pb.Revision) -> str:
    """The description, after the fields the store withholds, so a revision served
    without some of its fields says so."""
    if not revision.withheld_fields:
        return revision.description
    withheld = f"[withheld: {', '.join(revision.withheld_fields)}]"
    return f"{withheld} {revision.description}" if revision.description else withheld


async def _signers(stub: Any, name: str, settings: CtlSettings) -> dict[int, str]:
    """Each revision's `signer_text`, for `status NAME`."""
    signers: dict[int, str] = {}
    request = pb.ListRevisionsRequest(name=name, page_size=_PAGE_SIZE)
    async for page in pages(stub.ListRevisions, request, settings.unary_timeout_s):
        signers.update((r.revision, signer_text(r)) for r in page.revisions)
    return signers


async def cmd_status(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = validated_name(args.name) if args.name else ""
    statuses: list[pb.ReplicaAdapterStatus] = []
    # The store's default page (100): a page read cold costs a storage read per status
    # shard it needs, so small pages keep each call well inside its deadline.
    request = pb.GetAdapterStatusRequest(name=name)
    signers: dict[int, str] = {}
    async with connect_store(settings) as stub:
        async for page in pages(stub.GetAdapterStatus, request, settings.unary_timeout_s):
            statuses.extend(page.statuses)
        if name and statuses and not settings.json:
            signers = await _signers(stub, name, settings)
    if settings.json:
        console.out(dumps({"statuses": [message_to_json(s) for s in statuses]}))
        return EXIT_OK
    if not statuses:
        console.err("no live inference replica has reported to the store")
        return EXIT_OK
    rows = [
        (
            s.adapter_name,
            s.replica_id,
            _liveness(s.liveness),
            s.applied_seq,
            s.serving_revision or "-",
            signers.get(s.serving_revision, "-"),
            ", ".join(_revision_text(r) for r in s.revisions) or "not reported",
            format_time(s.seen_time),
            "; ".join(
                f"@{r.revision} {_error_text(r.error)}" for r in s.revisions if r.HasField("error")
            ),
        )
        for s in statuses
    ]
    headers = ("ADAPTER", "REPLICA", "LIVENESS", "APPLIED SEQ", "SERVING", "SIGNED BY")
    console.out(table((*headers, "REVISIONS", "LAST SEEN", "ERROR"), rows), multiline=True)
    return EXIT_OK


def _liveness(liveness: int) -> str:
    return pb.ReplicaLiveness.Name(liveness).removeprefix("REPLICA_LIVENESS_").lower()


def _revision_text(status: pb.RevisionStatus) -> str:
    state = pb.RevisionServingState.Name(status.state).removeprefix("REVISION_SERVING_STATE_")
    return f"{status.revision} {state}{' (candidate)' if status.candidate else ''}"


def _error_text(error: pb.ErrorStatus) -> str:
    if not error.code and not error.message:
        return ""
    return f"{status_code_name(error.code)}: {error.message}"


async def cmd_watch(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    async with connect_store(settings) as stub:
        after = args.after
        if after is None:
            # From now on: `--after 0` replays the whole kept log instead.
            page = await stub.ListAdapters(
                pb.ListAdaptersRequest(page_size=1), timeout=settings.unary_timeout_s
            )
            after = page.seq
        async for event in _events(stub, after, settings):
            if settings.json:
                console.out(dumps(message_to_json(event)))
            else:
                console.out(describe_event(event))
    return EXIT_OK


async def _events(stub: Any, after: int, settings: CtlSettings) -> AsyncIterator[pb.AdapterEvent]:
    call = stub.WatchAdapters(
        pb.WatchAdaptersRequest(after_seq=after), timeout=settings.stream_timeout_s
    )
    try:
        async for message in call:
            if message.HasField("event"):
                yield message.event
    except grpc.aio.AioRpcError as exc:
        # With --timeout, `watch` watches for that long; reaching the end is success.
        if exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
            raise
    finally:
        call.cancel()


def describe_event(event: pb.AdapterEvent) -> str:
    """One line per change, e.g. `seq=7 2026-01-02 03:04:05Z pushed alpha@3 current=3 by ci`."""
    what = {
        pb.EVENT_TYPE_REVISION_PUSHED: "pushed",
        pb.EVENT_TYPE_CURRENT_REVISION_SET: "current-set",
        pb.EVENT_TYPE_ADAPTER_DELETED: "deleted",
    }.get(event.type, pb.EventType.Name(event.type))
    if event.type == pb.EVENT_TYPE_ROLLOUT_CHANGED:
        state = pb.RolloutState.Name(event.rollout.state).removeprefix("ROLLOUT_STATE_").lower()
        what = f"rollout-{state} weight={event.rollout.weight:g}"
    if event.type == pb.EVENT_TYPE_QUOTA_CHANGED:
        return _describe_quota(event)
    ref = event.adapter_name
    if event.HasField("revision"):
        ref = f"{ref}@{event.revision.revision}"
    parts = [f"seq={event.seq}", format_time(event.time), what, ref]
    if event.type != pb.EVENT_TYPE_ADAPTER_DELETED:
        parts.append(f"current={event.current_revision}")
    if event.actor:
        parts.append(f"by {event.actor}")
    return " ".join(p for p in parts if p)


def _describe_quota(event: pb.AdapterEvent) -> str:
    """E.g. `seq=9 2026-01-02 03:04:05Z quota alpha in-flight 4 by ops`."""
    limits = quota_from_proto(event.quota).describe() if event.HasField("quota") else "cleared"
    parts = [f"seq={event.seq}", format_time(event.time), "quota"]
    parts += [event.adapter_name or "(default)", limits]
    if event.actor:
        parts.append(f"by {event.actor}")
    return " ".join(parts)

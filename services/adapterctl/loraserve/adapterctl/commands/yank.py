"""`adapterctl yank` and `unyank`: mark a revision as one no replica may serve pinned,
and lift the mark.

Each is a write with one idempotency key per invocation, retried by gRPC's policy on
UNAVAILABLE, and one entry in the store's change log, which every inference replica
applies at the same seq. NAME@REV and the reason are checked here first (exit 2,
nothing sent), and again by the store.
"""

from __future__ import annotations

import argparse

from loraserve.adapterctl.connection import connect_store
from loraserve.adapterctl.failures import EXIT_OK, UsageError
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import dumps, message_to_json
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.push import new_idempotency_key
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.names import AdapterRef, parse_adapter_ref


async def cmd_yank(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    ref = _revision_ref(args.ref)
    if not args.reason.strip():
        raise UsageError("--reason must say why the revision must not be served")
    request = pb.YankRevisionRequest(
        name=ref.name,
        revision=ref.revision,
        reason=args.reason,
        idempotency_key=new_idempotency_key(),
    )
    async with connect_store(settings) as stub:
        response: pb.YankRevisionResponse = await stub.YankRevision(
            request, timeout=settings.unary_timeout_s
        )
    if settings.json:
        console.out(dumps(message_to_json(response)))
    else:
        console.out(f"yanked {ref} (seq {response.seq}): {response.yank.reason}")
    return EXIT_OK


async def cmd_unyank(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    ref = _revision_ref(args.ref)
    request = pb.UnyankRevisionRequest(
        name=ref.name, revision=ref.revision, idempotency_key=new_idempotency_key()
    )
    async with connect_store(settings) as stub:
        response: pb.UnyankRevisionResponse = await stub.UnyankRevision(
            request, timeout=settings.unary_timeout_s
        )
    if settings.json:
        console.out(dumps(message_to_json(response)))
    else:
        console.out(f"unyanked {ref} (seq {response.seq})")
    return EXIT_OK


def _revision_ref(text: str) -> AdapterRef:
    """NAME@REV, with the revision: a yank is of one revision, never of a name."""
    try:
        ref = parse_adapter_ref(text)
    except InvalidArgument as exc:
        raise UsageError(exc.message) from None
    if ref.revision is None:
        raise UsageError(f"give the revision to yank as NAME@REV, e.g. {ref.name or 'NAME'}@3")
    return ref

"""The commands that change the store: push (once or watching), rollback, delete.

Each intended change gets one idempotency key, reused by every retry of it, so a
retry after UNAVAILABLE never changes the store twice: gRPC's retry policy resends
rollback and delete (`loraserve.clients.store`), a push retries itself
(`loraserve.clients.push`)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.adapterctl.commands.fleet_wait import wait_and_report
from loraserve.adapterctl.commands.push import (
    prepare_push,
    print_pushed,
    progress_for,
    pushed_json,
    validated_name,
)
from loraserve.adapterctl.commands.push_trace import PushTrace, traced_push
from loraserve.adapterctl.connection import connect_store
from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_OK, UsageError
from loraserve.adapterctl.settings import CtlSettings, push_tracing_from_args
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import dumps, message_to_json
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.push import new_idempotency_key, push, upload

if TYPE_CHECKING:
    from loraserve.adapterctl.commands.signed_push import SigningKey
    from loraserve.adapterctl.commands.watch_dir import Fingerprint


def _push_signing(args: argparse.Namespace) -> SigningKey | None:
    """The key a push signs with, after refusing flags that do not go together."""
    if args.trace and args.watch:
        raise UsageError("--trace traces one push; it does not go with --watch")
    if args.wait is not None and (args.watch or args.no_promote):
        raise UsageError(
            "--wait waits for replicas to serve the new revision: it cannot go with "
            f"--{'watch' if args.watch else 'no-promote'}"
        )
    if not (args.sign_key or args.sign_cert):
        return None
    if args.watch:
        raise UsageError("--sign-key signs one push; it does not go with --watch")
    # Here, not at the top: cryptography's import is start-up time a plain push need not pay.
    from loraserve.adapterctl.commands.signed_push import SigningKey

    return SigningKey.from_args(args.sign_key, args.sign_cert)


async def cmd_push(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = validated_name(args.name)
    directory = Path(args.directory)
    signing = _push_signing(args)
    if args.watch:
        # Here, not at the top: watchdog's import is start-up time every plain push pays.
        from loraserve.adapterctl.commands.watch_dir import watch_directory

        async with connect_store(settings) as stub:
            publisher = StorePublisher(stub, name, settings, args.no_promote, args.description)
            await watch_directory(name, directory, publisher, console, args.settle)
        return EXIT_OK
    async with traced_push(push_tracing_from_args(args), name, console) as traced:
        return await _push_once(args, settings, console, (name, directory), signing, traced)


async def _push_once(
    args: argparse.Namespace,
    settings: CtlSettings,
    console: Console,
    what: tuple[str, Path],
    signing: SigningKey | None,
    traced: PushTrace,
) -> int:
    """One push of the directory: hashed, sent (signed with `signing`), reported."""
    name, directory = what
    files = await prepare_push(directory, console, traced.tracer)
    traced.describe(files)
    progress = progress_for(console, f"uploading {name}", files.total_size)
    async with connect_store(settings) as stub:

        def send(signature: bytes, idempotency_key: str) -> Awaitable[pb.PushAdapterResponse]:
            return push(
                stub,
                name,
                files,
                no_promote=args.no_promote,
                description=args.description,
                timeout_s=settings.stream_timeout_s,
                idempotency_key=idempotency_key,
                progress=progress.advance,
                on_retry=lambda exc: console.err(
                    f"push of {name} failed: {exc.code().name}: {exc.details()}; retrying"
                ),
                signature=signature,
                spans=traced.tracer,
            )

        try:
            if signing is not None:
                from loraserve.adapterctl.commands.signed_push import push_signed

                response = await push_signed(
                    stub, name, files, signing, send, console, settings.unary_timeout_s
                )
            else:
                response = await send(b"", new_idempotency_key())
        finally:
            progress.finish()
        if args.wait is not None:
            # The revision first, for scripts; the replicas' answers after it.
            if not settings.json:
                print_pushed(console, settings, response)
            target = (response.revision.revision, response.seq)
            result = pushed_json(response, traced.trace_id)
            return await wait_and_report(stub, settings, console, name, target, args.wait, result)
    print_pushed(console, settings, response, traced.trace_id)
    return EXIT_OK


class StorePublisher:
    """Publishes a watched directory's settled states to the store."""

    def __init__(
        self, stub: Any, name: str, settings: CtlSettings, no_promote: bool, description: str
    ) -> None:
        self._stub = stub
        self._name = name
        self._settings = settings
        self._no_promote = no_promote
        self._description = description
        # The content of a publish that failed, with its key: publishing the same
        # content again is a retry of it, and a retry reuses the key.
        self._pending: tuple[Fingerprint, str] | None = None

    async def last_published(self) -> tuple[str, Fingerprint] | None:
        """The latest revision, current or not: with --no-promote it is what was last pushed."""
        try:
            page = await self._stub.ListRevisions(
                pb.ListRevisionsRequest(name=self._name, page_size=1),
                timeout=self._settings.unary_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None
            raise
        if not page.revisions:
            return None
        latest = page.revisions[0]
        fingerprint = tuple(sorted((f.name, f.size, f.sha256) for f in latest.files))
        return f"{self._name}@{latest.revision}", fingerprint

    async def publish(self, files: AdapterFiles) -> str:
        fingerprint = files.fingerprint()
        if self._pending is None or self._pending[0] != fingerprint:
            self._pending = (fingerprint, new_idempotency_key())
        response = await upload(
            self._stub,
            self._name,
            files,
            no_promote=self._no_promote,
            description=self._description,
            timeout_s=self._settings.stream_timeout_s,
            idempotency_key=self._pending[1],
        )
        self._pending = None
        if self._settings.json:
            return dumps(message_to_json(response))
        return f"{response.revision.adapter_name}@{response.revision.revision}"


async def cmd_rollback(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = validated_name(args.name)
    request = pb.SetCurrentRevisionRequest(
        name=name,
        revision=args.revision,
        expected_current_revision=args.expect_current or 0,
        idempotency_key=new_idempotency_key(),
    )
    async with connect_store(settings) as stub:
        response = await stub.SetCurrentRevision(request, timeout=settings.unary_timeout_s)
        if not settings.json:
            console.out(f"{name}@{response.adapter.current_revision}")
        if args.wait is not None:
            target = (args.revision, response.seq)
            result = message_to_json(response)
            return await wait_and_report(stub, settings, console, name, target, args.wait, result)
    if settings.json:
        console.out(dumps(message_to_json(response)))
    return EXIT_OK


async def cmd_delete(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    name = validated_name(args.name)
    if not args.yes:
        if not console.stdin_is_tty:
            raise UsageError(
                f"refusing to delete {name!r} without confirmation: stdin is not a terminal; "
                "pass --yes"
            )
        if not await console.confirm(f"Delete adapter {name!r} and all its revisions?"):
            console.err(f"not deleted: {name}")
            return EXIT_FAILED
    request = pb.DeleteAdapterRequest(name=name, idempotency_key=new_idempotency_key())
    async with connect_store(settings) as stub:
        response = await stub.DeleteAdapter(request, timeout=settings.unary_timeout_s)
    if settings.json:
        console.out(dumps({"name": name, "seq": response.seq}))
    else:
        console.out(f"deleted {name}")
    return EXIT_OK

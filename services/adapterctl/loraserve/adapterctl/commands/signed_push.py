"""`adapterctl push --sign-key`: sign the revision the push will create, then push it.

A signature names `NAME@REV` (loraserve.common.trust.signing), and the store numbers
revisions, so the push asks the store for the number first (`GetNextRevision`) and
signs the digests it already computed. Another push committing in between takes the
number: the store answers ABORTED, and the push signs the next number and tries again
(with a new idempotency key: it is another request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.adapterctl.failures import UsageError
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.push import new_idempotency_key
from loraserve.common.errors import InvalidArgument, LoraserveError
from loraserve.common.revisions.manifest import FileInfo, RevisionKey
from loraserve.common.trust.signing import check_signing_key, sign_revision

# Pushes racing this one for the adapter's next number: each lost race signs again.
SIGN_ATTEMPTS = 3


@dataclass(frozen=True)
class SigningKey:
    """`--sign-key` and, for certificate signing, `--sign-cert`."""

    private_key: Path
    certificate: Path | None

    @classmethod
    def from_args(cls, sign_key: str | None, sign_cert: str | None) -> SigningKey | None:
        """Checked before anything is hashed or sent; None when not signing."""
        if sign_cert and not sign_key:
            raise UsageError("--sign-cert needs --sign-key (the certificate's private key)")
        if not sign_key:
            return None
        key = cls(Path(sign_key), Path(sign_cert) if sign_cert else None)
        try:
            check_signing_key(key.private_key, key.certificate)
        except LoraserveError as exc:
            raise UsageError(exc.message) from None
        return key

    def sign(self, key: RevisionKey, files: AdapterFiles) -> bytes:
        infos = [FileInfo(f.name, f.size, f.sha256) for f in files.files]
        try:
            return sign_revision(key, infos, self.private_key, self.certificate)
        except InvalidArgument as exc:
            raise UsageError(exc.message) from None


async def push_signed(
    stub: Any,
    name: str,
    files: AdapterFiles,
    signing: SigningKey,
    send: Callable[[bytes, str], Awaitable[pb.PushAdapterResponse]],
    console: Console,
    timeout_s: float | None,
) -> pb.PushAdapterResponse:
    """Signs `NAME@<next revision>` and pushes it with `send(signature, idempotency
    key)`; signs again when another push took that number first, at most
    SIGN_ATTEMPTS times."""
    for attempt in range(1, SIGN_ATTEMPTS + 1):
        next_revision = await stub.GetNextRevision(
            pb.GetNextRevisionRequest(name=name), timeout=timeout_s
        )
        key = RevisionKey(name, next_revision.revision)
        signature = await asyncio.to_thread(signing.sign, key, files)
        try:
            # A new key each time: a push signed for another number is another request.
            return await send(signature, new_idempotency_key())
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.ABORTED or attempt == SIGN_ATTEMPTS:
                raise
            console.err(f"{exc.details()}; signing {name} again")
    raise AssertionError("unreachable: the last attempt returns or raises")

"""Signed revisions, replica side: with `--signature-policy require`, a revision that
reaches the log without a valid signature by a trusted signer is NACKed with the reason
and never served, and the previous revision keeps serving.

The attacker writes to the bucket with boto3, bypassing the store (whose own policy is
off here, so nothing stops a bad revision before the log): other bytes under a blob's
key, a forged log entry for an unsigned revision, a signed revision's entry replayed
under another name or number. Real parts: moto over HTTP, the store's gRPC server, the
inference app on the session's vLLM engine.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.common.revisions.manifest import RevisionKey
from loraserve.common.trust.signing import sign_revision
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.adapters.pushes import hashed
from loraserve.testing.adapters.signers import KeyPair, write_key_pair
from loraserve.testing.inference.app import RunningInference, adapter_files, inference_app
from loraserve.testing.inference.stack import replica_answer
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.forgery import forge_push, log_entry, put_blobs, replace_blob
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

REPLICA = "signed-replica"
WEIGHTS = "adapter_model.safetensors"
NACK = store_pb.REPORT_TYPE_NACK


@dataclass
class SignedStack:
    store: RunningStore
    bucket: S3Bucket
    inference: RunningInference
    key: KeyPair

    async def push(
        self, name: str, files: AdapterFiles, revision: int | None, **header: Any
    ) -> int:
        """Pushes through the store, signed for `name`@`revision` (None: unsigned)."""
        signature = b""
        if revision is not None:
            signature = sign_revision(RevisionKey(name, revision), hashed(files), self.key.private)
        async with store_stub(self.store.address) as stub:
            response = await push(stub, name, files, signature=signature, **header)
        return int(response.revision.revision)

    async def report(self, name: str, revision: int) -> store_pb.ReplicaAdapterStatus:
        return await replica_answer(self.store.address, REPLICA, name, revision)

    async def still_serves_revision_one(self) -> None:
        revision, tokens = await self.inference.generate("alpha", 4)
        assert (revision, len(tokens)) == (1, 4)
        assert await self.inference.current("alpha") == 1


@pytest.fixture
async def signed(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> AsyncIterator[SignedStack]:
    """`alpha`@1 signed by the `ci` key and served by a replica that requires it."""
    key = write_key_pair(tmp_path / "keys", "ci")
    files = adapter_files(tiny_adapter(seed=1))
    signature = sign_revision(RevisionKey("alpha", 1), hashed(files), key.private)
    async with store_stub(store_server.address) as stub:
        await push(stub, "alpha", files, signature=signature)
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        replica_id=REPLICA,
        extra=("--signature-policy", "require", "--trusted-signers", f"ci={key.public}"),
    ) as inference:
        yield SignedStack(store_server, s3_bucket, inference, key)


async def test_a_revision_signed_by_a_trusted_key_is_served(
    signed: SignedStack, tiny_adapter: TinyAdapterFactory
) -> None:
    assert await signed.push("alpha", adapter_files(tiny_adapter(seed=2)), 2) == 2
    assert (await signed.report("alpha", 2)).type == store_pb.REPORT_TYPE_ACK
    revision, _ = await signed.inference.generate("alpha", 4)
    assert revision == 2


async def test_an_unsigned_revision_in_the_log_is_nacked_and_never_served(
    signed: SignedStack, tiny_adapter: TinyAdapterFactory
) -> None:
    await signed.push("alpha", adapter_files(tiny_adapter(seed=2)), None)
    report = await signed.report("alpha", 2)
    assert report.type == NACK
    assert report.last_error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "not signed" in report.last_error.message
    assert report.serving_revision == 1
    assert "alpha@2" not in signed.inference.add_calls
    await signed.still_serves_revision_one()


async def test_a_forged_log_entry_for_an_unsigned_revision_is_nacked_and_never_served(
    signed: SignedStack, tiny_adapter: TinyAdapterFactory
) -> None:
    files = adapter_files(tiny_adapter(seed=3))
    original = log_entry(signed.bucket, 1).revision
    assert original is not None
    forged = replace(original, files=put_blobs(signed.bucket, files), signature=b"", signed_by="")
    forge_push(signed.bucket, forged)
    report = await signed.report("alpha", 2)
    assert (report.type, report.serving_revision) == (NACK, 1)
    assert "not signed" in report.last_error.message
    assert "alpha@2" not in signed.inference.add_calls
    await signed.still_serves_revision_one()


async def test_other_bytes_under_a_signed_blobs_key_are_never_served(
    signed: SignedStack, tiny_adapter: TinyAdapterFactory
) -> None:
    files = adapter_files(tiny_adapter(seed=2))
    await signed.push("alpha", files, 2, no_promote=True)
    evil = adapter_files(tiny_adapter(seed=4))[WEIGHTS]
    replace_blob(signed.bucket, hashlib.sha256(files[WEIGHTS]).hexdigest(), evil)
    async with store_stub(signed.store.address) as stub:
        await stub.SetCurrentRevision(store_pb.SetCurrentRevisionRequest(name="alpha", revision=2))
    report = await signed.report("alpha", 2)
    assert (report.type, report.serving_revision) == (NACK, 1)
    assert report.last_error.code == grpc.StatusCode.DATA_LOSS.value[0]
    assert "alpha@2" not in signed.inference.add_calls
    await signed.still_serves_revision_one()


async def test_a_forged_entry_naming_replaced_bytes_under_an_old_signature_is_nacked(
    signed: SignedStack, tiny_adapter: TinyAdapterFactory
) -> None:
    original = log_entry(signed.bucket, 1).revision
    assert original is not None
    evil = adapter_files(tiny_adapter(seed=4))
    # The attacker's bytes at their true content address, with alpha@1's signature.
    forged = replace(original, files=put_blobs(signed.bucket, evil))
    forge_push(signed.bucket, forged)
    report = await signed.report("alpha", 2)
    assert (report.type, report.serving_revision) == (NACK, 1)
    assert report.last_error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "alpha@2" not in signed.inference.add_calls
    await signed.still_serves_revision_one()


async def test_a_signed_revision_replayed_under_another_name_is_nacked_and_never_served(
    signed: SignedStack,
) -> None:
    original = log_entry(signed.bucket, 1).revision
    assert original is not None
    forge_push(signed.bucket, original, name="beta")
    report = await signed.report("beta", 1)
    assert report.type == NACK
    assert "'alpha@1'" in report.last_error.message
    assert "beta" in report.last_error.message
    assert "beta@1" not in signed.inference.add_calls
    # A request for it loads nothing either: it is refused with the same reason.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await signed.inference.generate("beta", 4)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'alpha@1'" in (refused.value.details() or "")
    assert "beta@1" not in signed.inference.add_calls


async def test_a_signed_revision_replayed_as_a_newer_revision_is_nacked_and_never_served(
    signed: SignedStack, tiny_adapter: TinyAdapterFactory
) -> None:
    await signed.push("alpha", adapter_files(tiny_adapter(seed=2)), 2)
    assert (await signed.report("alpha", 2)).type == store_pb.REPORT_TYPE_ACK
    original = log_entry(signed.bucket, 1).revision
    assert original is not None
    forge_push(signed.bucket, original)  # alpha@1's files and signature as alpha@3
    report = await signed.report("alpha", 3)
    assert (report.type, report.serving_revision) == (NACK, 2)
    assert "'alpha@1'" in report.last_error.message or "alpha@1:" in report.last_error.message
    assert "alpha@3" not in signed.inference.add_calls
    revision, _ = await signed.inference.generate("alpha", 4)
    assert revision == 2

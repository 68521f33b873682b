"""The store's check of a push's signature, over real gRPC and S3 (moto over HTTP), with
signatures adapterctl could not have sent: over other bytes, for another adapter or
revision, oversized, malformed, by an expired certificate."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.common.config.textlimits import MAX_SIGNATURE_BYTES
from loraserve.common.revisions.manifest import FileInfo, RevisionKey
from loraserve.common.trust.policy import SignaturePolicy, TrustSettings
from loraserve.common.trust.signers import parse_trusted_signers
from loraserve.common.trust.signing import sign_revision
from loraserve.testing.adapters.files import AdapterFiles, tiny_adapter
from loraserve.testing.adapters.signers import KeyPair, write_certificate_signer
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore, running_store, stored_objects


def _infos(files: AdapterFiles) -> list[FileInfo]:
    return [FileInfo(n, len(d), hashlib.sha256(d).hexdigest()) for n, d in files.items()]


async def _refusal(
    store: RunningStore, name: str, files: AdapterFiles, signature: bytes
) -> grpc.aio.AioRpcError:
    async with store_stub(store.address) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await push(stub, name, files, signature=signature)
    return refused.value


async def test_a_signature_over_other_bytes_is_refused_with_invalid_argument(
    strict_store: RunningStore, ci_key: KeyPair
) -> None:
    signed_files = tiny_adapter(seed=1)
    pushed_files = tiny_adapter(seed=2)
    signature = sign_revision(RevisionKey("alpha", 1), _infos(signed_files), ci_key.private)
    error = await _refusal(strict_store, "alpha", pushed_files, signature)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "covers other bytes" in (error.details() or "")
    assert "adapter_model.safetensors" in (error.details() or "")
    assert stored_objects(strict_store) == []


async def test_a_signature_for_another_adapter_is_refused_with_invalid_argument(
    strict_store: RunningStore, ci_key: KeyPair
) -> None:
    files = tiny_adapter(seed=1)
    signature = sign_revision(RevisionKey("beta", 1), _infos(files), ci_key.private)
    error = await _refusal(strict_store, "alpha", files, signature)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "'beta@1'" in (error.details() or "")
    assert stored_objects(strict_store) == []


async def test_a_signature_for_a_revision_number_already_taken_is_aborted(
    strict_store: RunningStore, ci_key: KeyPair
) -> None:
    files = tiny_adapter(seed=1)
    first = sign_revision(RevisionKey("alpha", 1), _infos(files), ci_key.private)
    async with store_stub(strict_store.address) as stub:
        await push(stub, "alpha", files, signature=first)
    error = await _refusal(strict_store, "alpha", files, first)
    assert error.code() is grpc.StatusCode.ABORTED
    assert "alpha@1" in (error.details() or "")
    assert "alpha@2" in (error.details() or "")


async def test_a_signature_over_the_size_limit_is_refused_and_nothing_is_stored(
    strict_store: RunningStore,
) -> None:
    error = await _refusal(strict_store, "alpha", tiny_adapter(), b"{" * (MAX_SIGNATURE_BYTES + 1))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"signature is {MAX_SIGNATURE_BYTES + 1} bytes; the limit is {MAX_SIGNATURE_BYTES}" in (
        error.details() or ""
    )
    assert stored_objects(strict_store) == []


async def test_a_10_mb_signature_is_refused_and_nothing_is_stored(
    strict_store: RunningStore,
) -> None:
    error = await _refusal(strict_store, "alpha", tiny_adapter(), b"x" * (10 * 1024 * 1024))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "signature is 10485760 bytes; the limit is" in (error.details() or "")
    assert stored_objects(strict_store) == []


async def test_a_malformed_signature_is_refused_with_invalid_argument(
    strict_store: RunningStore,
) -> None:
    error = await _refusal(strict_store, "alpha", tiny_adapter(), b'{"mediaType": 3}')
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "no model-signing bundle" in (error.details() or "")
    assert stored_objects(strict_store) == []


async def test_a_signature_by_an_expired_certificate_is_refused_with_permission_denied(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    signer = write_certificate_signer(tmp_path / "pki", "old-bot", expired=True)
    files = tiny_adapter()
    # Signed as model-signing itself would, without adapterctl's own check of the date.
    from model_signing._signing import sign_certificate
    from model_signing._signing.signing import Payload

    from loraserve.common.trust.signing import signing_manifest

    bundle: Any = sign_certificate.Signer(
        signer.private, signer.certificate, [signer.certificate]
    ).sign(Payload(signing_manifest(RevisionKey("alpha", 1), _infos(files))))
    trust = TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(str(signer.ca)))
    async with running_store(s3_bucket, trust=trust) as store:
        error = await _refusal(store, "alpha", files, bundle.bundle.to_json().encode())
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "expired on" in (error.details() or "")
        assert stored_objects(store) == []


async def test_a_bundle_whose_verification_material_is_no_object_is_invalid_argument(
    strict_store: RunningStore,
) -> None:
    error = await _refusal(strict_store, "alpha", tiny_adapter(), b'{"verificationMaterial":[]}')
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "no model-signing bundle" in (error.details() or "")
    assert "verificationMaterial" in (error.details() or "")
    assert stored_objects(strict_store) == []


async def test_a_malformed_bundle_under_warn_is_pushed_as_unverified(
    s3_bucket: S3Bucket, ci_key: KeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    trust = TrustSettings(SignaturePolicy.WARN, parse_trusted_signers(str(ci_key.public)))
    with caplog.at_level(logging.WARNING, logger="loraserve.common.trust.policy"):
        async with (
            running_store(s3_bucket, trust=trust) as store,
            store_stub(store.address) as stub,
        ):
            response = await push(
                stub, "alpha", tiny_adapter(), signature=b'{"verificationMaterial":[]}'
            )
    assert (response.revision.revision, response.revision.signed_by) == (1, "")
    assert any("signature.unverified name=alpha" in r.getMessage() for r in caplog.records)

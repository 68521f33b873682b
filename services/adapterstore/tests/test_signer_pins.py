"""Which signers the store trusts, and for what (issue 54 item 3): a signing
certificate must be for code signing, and a `--trusted-signers` entry may pin the
leaf's subject or subjectAltName and the adapter names it may sign. Real certificates,
a real store over gRPC and S3 (moto over HTTP)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from loraserve.common.revisions.manifest import RevisionKey
from loraserve.common.trust.policy import SignaturePolicy, TrustSettings
from loraserve.common.trust.signers import parse_trusted_signers
from loraserve.common.trust.signing import sign_revision
from loraserve.testing.adapters.files import AdapterFiles, tiny_adapter
from loraserve.testing.adapters.pki import TestCA, raw_certificate_bundle, write_ca
from loraserve.testing.adapters.pushes import hashed
from loraserve.testing.adapters.signers import KeyPair
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore, running_store, stored_objects


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return write_ca(tmp_path / "pki", "internal")


def _require(entries: str) -> TrustSettings:
    return TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(entries))


async def _push_code(store: RunningStore, name: str, files: AdapterFiles, signature: bytes) -> str:
    """The push's status code name, and its details when refused."""
    async with store_stub(store.address) as stub:
        try:
            await push(stub, name, files, signature=signature)
        except grpc.aio.AioRpcError as refused:
            return f"{refused.code().name}: {refused.details()}"
    return "OK"


async def test_a_tls_certificate_of_a_trusted_ca_cannot_sign(
    s3_bucket: S3Bucket, ca: TestCA
) -> None:
    tls = ca.issue("api.internal", usage=ExtendedKeyUsageOID.SERVER_AUTH)
    files = tiny_adapter()
    bundle = raw_certificate_bundle(tls, RevisionKey("alpha", 1), files)
    async with running_store(s3_bucket, trust=_require(str(ca.path))) as store:
        outcome = await _push_code(store, "alpha", files, bundle)
        assert outcome.startswith("PERMISSION_DENIED: alpha: certificate CN=api.internal")
        assert "codeSigning" in outcome
        assert stored_objects(store) == []


async def test_a_signer_pinned_to_a_prefix_cannot_sign_another_teams_adapter(
    s3_bucket: S3Bucket, ci_key: KeyPair
) -> None:
    files = tiny_adapter()
    signature = sign_revision(RevisionKey("team-b-x", 1), hashed(files), ci_key.private)
    async with running_store(
        s3_bucket, trust=_require(f"ci={ci_key.public};prefix=team-a-")
    ) as store:
        outcome = await _push_code(store, "team-b-x", files, signature)
        assert outcome.startswith("PERMISSION_DENIED: team-b-x: ")
        assert "prefix team-a-" in outcome
        assert stored_objects(store) == []


async def test_a_signer_pinned_to_a_prefix_signs_its_own_adapters(
    s3_bucket: S3Bucket, ci_key: KeyPair
) -> None:
    files = tiny_adapter()
    signature = sign_revision(RevisionKey("team-a-x", 1), hashed(files), ci_key.private)
    trust = _require(f"ci={ci_key.public};prefix=team-b-;prefix=team-a-")
    async with running_store(s3_bucket, trust=trust) as store:
        assert await _push_code(store, "team-a-x", files, signature) == "OK"


async def test_a_subject_pin_refuses_another_leaf_of_the_same_ca(
    s3_bucket: S3Bucket, ca: TestCA
) -> None:
    other = ca.issue("other-bot")
    files = tiny_adapter()
    signature = sign_revision(
        RevisionKey("alpha", 1), hashed(files), other.private, other.certificate
    )
    trust = _require(f'release={ca.path};subject="CN=release-bot"')
    async with running_store(s3_bucket, trust=trust) as store:
        outcome = await _push_code(store, "alpha", files, signature)
        assert outcome.startswith("PERMISSION_DENIED: alpha: certificate CN=other-bot")
        assert "subject is not CN=release-bot" in outcome
        assert stored_objects(store) == []


async def test_a_san_pin_refuses_another_leaf_of_the_same_ca(
    s3_bucket: S3Bucket, ca: TestCA
) -> None:
    other = ca.issue("bot-2", sans=(x509.RFC822Name("intruder@example.com"),))
    files = tiny_adapter()
    signature = sign_revision(
        RevisionKey("alpha", 1), hashed(files), other.private, other.certificate
    )
    trust = _require(f"release={ca.path};san=email:release@example.com")
    async with running_store(s3_bucket, trust=trust) as store:
        outcome = await _push_code(store, "alpha", files, signature)
        assert outcome.startswith("PERMISSION_DENIED: alpha: certificate CN=bot-2")
        assert "no subjectAltName email:release@example.com" in outcome
        assert stored_objects(store) == []


async def test_a_pinned_leaf_signs_with_its_subject_san_and_prefix(
    s3_bucket: S3Bucket, ca: TestCA
) -> None:
    bot = ca.issue("release-bot", sans=(x509.UniformResourceIdentifier("spiffe://ci/release"),))
    files = tiny_adapter()
    key = RevisionKey("team-a-x", 1)
    signature = sign_revision(key, hashed(files), bot.private, bot.certificate)
    entry = f'release={ca.path};subject="CN=release-bot";san=uri:spiffe://ci/release;prefix=team-a-'
    async with running_store(s3_bucket, trust=_require(entry)) as store:
        assert await _push_code(store, "team-a-x", files, signature) == "OK"

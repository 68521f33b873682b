"""The store's signature policy on the writes that make an existing revision served
(issue 54 item 6): SetCurrentRevision (adapterctl rollback's call) and a rollout's
start. A revision pushed while the policy was off, and so unsigned, is refused under
require, as a replica under the same policy would refuse it. A real store over gRPC
and S3 (moto over HTTP), restarted on the same bucket with another policy."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.revisions.manifest import RevisionKey
from loraserve.common.trust.policy import SignaturePolicy, TrustSettings
from loraserve.common.trust.signers import parse_trusted_signers
from loraserve.common.trust.signing import sign_revision
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import hashed
from loraserve.testing.adapters.signers import KeyPair
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore, running_store


async def _push(store: RunningStore, revision: int, key: KeyPair | None, **header: bool) -> None:
    """Pushes alpha@`revision`, signed with `key` (None: unsigned)."""
    files = tiny_adapter(seed=revision)
    signature = b""
    if key is not None:
        signature = sign_revision(RevisionKey("alpha", revision), hashed(files), key.private)
    async with store_stub(store.address) as stub:
        response = await push(stub, "alpha", files, signature=signature, **header)
    assert response.revision.revision == revision


@pytest.fixture
async def signed_then_unsigned(s3_bucket: S3Bucket, ci_key: KeyPair) -> S3Bucket:
    """alpha@1 signed by `ci` and current; alpha@2 unsigned, pushed without promoting
    while the store's policy was off."""
    async with running_store(s3_bucket) as store:
        await _push(store, 1, ci_key)
        await _push(store, 2, None, no_promote=True)
    return s3_bucket


def _trust(policy: SignaturePolicy, key: KeyPair) -> TrustSettings:
    return TrustSettings(policy, parse_trusted_signers(f"ci={key.public}"))


@pytest.fixture
async def strict_again(
    signed_then_unsigned: S3Bucket, ci_key: KeyPair
) -> AsyncIterator[RunningStore]:
    """The store restarted on that bucket requiring revisions signed by `ci`."""
    trust = _trust(SignaturePolicy.REQUIRE, ci_key)
    async with running_store(signed_then_unsigned, trust=trust) as store:
        yield store


async def _code(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as refused:
        return refused.code(), refused.details() or ""
    return grpc.StatusCode.OK, ""


async def test_making_an_unsigned_revision_current_is_refused_under_require(
    strict_again: RunningStore,
) -> None:
    async with store_stub(strict_again.address) as stub:
        code, details = await _code(
            stub.SetCurrentRevision(pb.SetCurrentRevisionRequest(name="alpha", revision=2))
        )
        adapter = (await stub.GetAdapter(pb.GetAdapterRequest(name="alpha"))).adapter
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert details.startswith("alpha@2 cannot be made current: ")
    assert "not signed" in details
    assert adapter.current_revision == 1


async def test_rolling_back_to_an_unsigned_revision_is_refused_under_require(
    s3_bucket: S3Bucket, ci_key: KeyPair
) -> None:
    async with running_store(s3_bucket) as store:
        await _push(store, 1, None)
        await _push(store, 2, ci_key)
    async with (
        running_store(s3_bucket, trust=_trust(SignaturePolicy.REQUIRE, ci_key)) as store,
        store_stub(store.address) as stub,
    ):
        request = pb.SetCurrentRevisionRequest(
            name="alpha", revision=1, expected_current_revision=2
        )
        code, details = await _code(stub.SetCurrentRevision(request))
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert details.startswith("alpha@1 cannot be made current: ")


async def test_a_rollout_of_an_unsigned_candidate_is_refused_under_require(
    strict_again: RunningStore,
) -> None:
    request = pb.StartRolloutRequest(
        name="alpha", revision=2, weight=10, guards=pb.RolloutGuards(abort_on_nack=True)
    )
    async with store_stub(strict_again.address) as stub:
        code, details = await _code(stub.StartRollout(request))
        adapter = (await stub.GetAdapter(pb.GetAdapterRequest(name="alpha"))).adapter
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    assert details.startswith("alpha@2 cannot be made a rollout candidate: ")
    assert "not signed" in details
    assert not adapter.HasField("rollout")


async def test_making_an_unsigned_revision_current_under_warn_is_logged_and_done(
    signed_then_unsigned: S3Bucket, ci_key: KeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    trust = _trust(SignaturePolicy.WARN, ci_key)
    with caplog.at_level(logging.WARNING, logger="loraserve.common.trust.policy"):
        async with (
            running_store(signed_then_unsigned, trust=trust) as store,
            store_stub(store.address) as stub,
        ):
            request = pb.SetCurrentRevisionRequest(name="alpha", revision=2)
            response = await stub.SetCurrentRevision(request)
    assert response.adapter.current_revision == 2
    assert any("signature.unverified name=alpha" in r.getMessage() for r in caplog.records)

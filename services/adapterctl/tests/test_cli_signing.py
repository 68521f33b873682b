"""Signed pushes: adapterctl push --sign-key against a real store (gRPC on 127.0.0.1, S3
over moto HTTP) that verifies signatures at push, and what adapterctl shows of them."""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.x509.oid import ExtendedKeyUsageOID

from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_NOT_ALLOWED, EXIT_USAGE
from loraserve.common.config.textlimits import MAX_SIGNATURE_BYTES
from loraserve.common.trust.policy import SignaturePolicy, TrustSettings
from loraserve.common.trust.signers import parse_trusted_signers
from loraserve.testing.adapters.ctl import ctl, write_adapter_dir
from loraserve.testing.adapters.pki import write_ca
from loraserve.testing.adapters.signers import KeyPair, write_certificate_signer, write_key_pair
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import store_stub
from loraserve.testing.store.old_store import write_old_push
from loraserve.testing.store.server import RunningStore, running_store, stored_objects
from loraserve.testing.store.statuses import report_request, routed


def _env(store: RunningStore) -> dict[str, str]:
    return {"ADAPTERSTORE_ADDR": store.address}


async def test_signed_push_is_accepted_and_revisions_show_the_signer(
    strict_store: RunningStore, ci_key: KeyPair, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path / "a")
    pushed = await ctl(
        "push", "alpha", str(adapter), "--sign-key", str(ci_key.private), env=_env(strict_store)
    )
    assert (pushed.code, pushed.out.strip()) == (0, "alpha@1"), pushed.err
    listed = await ctl("revisions", "alpha", env=_env(strict_store))
    header, row = listed.out.splitlines()
    assert "SIGNED BY" in header
    assert " ci " in row
    as_json = await ctl("revisions", "alpha", "--json", env=_env(strict_store))
    revision = json.loads(as_json.out)["revisions"][0]
    assert revision["signed_by"] == "ci"
    assert json.loads(bytes.fromhex(revision["signature"]))["dsseEnvelope"]["signatures"]


async def test_unsigned_push_is_refused_with_failed_precondition_and_nothing_is_stored(
    strict_store: RunningStore, tmp_path: Path
) -> None:
    result = await ctl("push", "alpha", str(write_adapter_dir(tmp_path)), env=_env(strict_store))
    assert result.code == EXIT_FAILED
    assert "FAILED_PRECONDITION" in result.err
    assert "not signed" in result.err
    assert "--sign-key" in result.err
    assert stored_objects(strict_store) == []


async def test_push_signed_by_an_unknown_key_is_refused_with_permission_denied(
    strict_store: RunningStore, tmp_path: Path
) -> None:
    stranger = write_key_pair(tmp_path / "keys", "stranger")
    result = await ctl(
        "push",
        "alpha",
        str(write_adapter_dir(tmp_path / "a")),
        "--sign-key",
        str(stranger.private),
        env=_env(strict_store),
    )
    assert result.code == EXIT_NOT_ALLOWED
    assert "PERMISSION_DENIED" in result.err
    assert "not among the trusted signers" in result.err
    assert stored_objects(strict_store) == []


async def test_a_malformed_signing_key_is_a_usage_error_before_anything_is_sent(
    strict_store: RunningStore, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.key"
    bad.write_text("-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n")
    result = await ctl(
        "push",
        "alpha",
        str(write_adapter_dir(tmp_path / "a")),
        "--sign-key",
        str(bad),
        env=_env(strict_store),
    )
    assert result.code == EXIT_USAGE
    assert f"signing key {bad}" in result.err
    assert "not an unencrypted PEM private key" in result.err
    assert stored_objects(strict_store) == []


async def test_a_huge_file_given_as_signing_key_is_refused_unread(
    strict_store: RunningStore, tmp_path: Path
) -> None:
    huge = tmp_path / "weights.key"
    huge.write_bytes(b"\0" * (10 * 1024 * 1024))
    result = await ctl(
        "push",
        "alpha",
        str(write_adapter_dir(tmp_path / "a")),
        "--sign-key",
        str(huge),
        env=_env(strict_store),
    )
    assert result.code == EXIT_USAGE
    assert "10485760 bytes" in result.err
    assert stored_objects(strict_store) == []


async def test_push_signed_with_a_certificate_names_its_subject(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    signer = write_certificate_signer(tmp_path / "pki", "release-bot")
    trust = TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(str(signer.ca)))
    async with running_store(s3_bucket, trust=trust) as store:
        result = await ctl(
            "push",
            "alpha",
            str(write_adapter_dir(tmp_path / "a")),
            "--sign-key",
            str(signer.private),
            "--sign-cert",
            str(signer.certificate),
            env=_env(store),
        )
        assert result.code == 0, result.err
        listed = await ctl("revisions", "alpha", env=_env(store))
    assert " CN=release-bot " in listed.out


async def test_an_expired_certificate_is_refused_before_anything_is_sent(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    signer = write_certificate_signer(tmp_path / "pki", "old-bot", expired=True)
    trust = TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(str(signer.ca)))
    async with running_store(s3_bucket, trust=trust) as store:
        result = await ctl(
            "push",
            "alpha",
            str(write_adapter_dir(tmp_path / "a")),
            "--sign-key",
            str(signer.private),
            "--sign-cert",
            str(signer.certificate),
            env=_env(store),
        )
        assert result.code == EXIT_USAGE
        assert "expired on" in result.err
        assert "CN=old-bot" in result.err
        assert stored_objects(store) == []


async def test_warn_policy_accepts_an_unsigned_push_and_shows_no_signer(
    s3_bucket: S3Bucket, ci_key: KeyPair, tmp_path: Path
) -> None:
    trust = TrustSettings(SignaturePolicy.WARN, parse_trusted_signers(str(ci_key.public)))
    async with running_store(s3_bucket, trust=trust) as store:
        result = await ctl("push", "alpha", str(write_adapter_dir(tmp_path)), env=_env(store))
        assert (result.code, result.out.strip()) == (0, "alpha@1"), result.err
        listed = await ctl("revisions", "alpha", env=_env(store))
    assert " unsigned " in listed.out.splitlines()[1]


async def test_signed_push_after_a_delete_signs_the_number_the_store_gives(
    strict_store: RunningStore, ci_key: KeyPair, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path / "a")
    sign = ("--sign-key", str(ci_key.private))
    env = _env(strict_store)
    assert (await ctl("push", "alpha", str(adapter), *sign, env=env)).out.strip() == "alpha@1"
    assert (await ctl("push", "alpha", str(adapter), *sign, env=env)).out.strip() == "alpha@2"
    assert (await ctl("delete", "alpha", "--yes", env=env)).code == 0
    again = await ctl("push", "alpha", str(adapter), *sign, env=env)
    assert (again.code, again.out.strip()) == (0, "alpha@3"), again.err


async def test_status_shows_who_signed_the_revision_a_replica_serves(
    strict_store: RunningStore, ci_key: KeyPair, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path / "a")
    pushed = await ctl(
        "push", "alpha", str(adapter), "--sign-key", str(ci_key.private), env=_env(strict_store)
    )
    assert pushed.code == 0, pushed.err
    async with store_stub(strict_store.address) as stub:
        await stub.ReportReplicaStatus(report_request("replica-1", {"alpha": routed(1)}))
    status = await ctl("status", "alpha", env=_env(strict_store))
    header, row = status.out.splitlines()
    assert "SIGNED BY" in header
    assert row.split()[:6] == ["alpha", "replica-1", "live", "0", "1", "ci"]


async def test_revisions_show_a_signature_the_store_withholds_as_withheld(
    s3_bucket: S3Bucket,
) -> None:
    await write_old_push(s3_bucket, signature=b"s" * (MAX_SIGNATURE_BYTES + 1), signed_by="ci")
    async with running_store(s3_bucket) as store:
        listed = await ctl("revisions", "alpha", env=_env(store))
    assert listed.code == 0, listed.err
    newest = listed.out.splitlines()[1]
    assert " withheld " in newest
    assert newest.endswith("[withheld: signature]")


async def test_a_tls_certificate_is_refused_as_signer_before_anything_is_sent(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    ca = write_ca(tmp_path / "pki", "internal")
    tls = ca.issue("api.internal", usage=ExtendedKeyUsageOID.SERVER_AUTH)
    trust = TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(str(ca.path)))
    async with running_store(s3_bucket, trust=trust) as store:
        result = await ctl(
            "push",
            "alpha",
            str(write_adapter_dir(tmp_path / "a")),
            "--sign-key",
            str(tls.private),
            "--sign-cert",
            str(tls.certificate),
            env=_env(store),
        )
        assert result.code == EXIT_USAGE
        assert "certificate CN=api.internal is not for code signing" in result.err
        assert stored_objects(store) == []


async def test_rollback_to_a_revision_pushed_unsigned_is_refused_under_require(
    s3_bucket: S3Bucket, ci_key: KeyPair, tmp_path: Path
) -> None:
    adapter = str(write_adapter_dir(tmp_path / "a"))
    async with running_store(s3_bucket) as store:
        assert (await ctl("push", "alpha", adapter, env=_env(store))).code == 0
        signed = await ctl(
            "push", "alpha", adapter, "--sign-key", str(ci_key.private), env=_env(store)
        )
        assert signed.code == 0, signed.err
    trust = TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(f"ci={ci_key.public}"))
    async with running_store(s3_bucket, trust=trust) as store:
        result = await ctl("rollback", "alpha", "1", env=_env(store))
        current = await ctl("revisions", "alpha", env=_env(store))
    assert result.code == EXIT_FAILED
    assert "FAILED_PRECONDITION" in result.err
    assert "alpha@1 cannot be made current" in result.err
    assert "not signed" in result.err
    assert current.out.splitlines()[1].split()[:2] == ["2", "*"]  # still current

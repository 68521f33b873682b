"""`--trusted-signers` entries and their pins: the syntax, its errors naming the bad
entry, and the policy a replica applies to a revision (RevisionTrust.check_revision,
the check the store applies at push too), with real keys and certificates."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from loraserve.common.errors import InvalidArgument, PermissionDenied
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.common.trust.policy import RevisionTrust, SignaturePolicy, TrustSettings
from loraserve.common.trust.signers import parse_trusted_signers
from loraserve.common.trust.signing import sign_revision
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pki import TestCA, raw_certificate_bundle, write_ca
from loraserve.testing.adapters.pushes import hashed
from loraserve.testing.adapters.signers import KeyPair, write_key_pair


@pytest.fixture
def key(tmp_path: Path) -> KeyPair:
    return write_key_pair(tmp_path / "keys", "ci")


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return write_ca(tmp_path / "pki", "internal")


def _revision(name: str, signature: bytes) -> Revision:
    files = tiny_adapter()
    return Revision(
        adapter_name=name,
        revision=1,
        files=tuple(hashed(files)),
        base_model="tiny",
        rank=8,
        alpha=16.0,
        target_modules=("q_proj",),
        create_time=datetime.now(UTC),
        pushed_by="tester",
        description="",
        seq=1,
        signature=signature,
    )


def _trust(policy: SignaturePolicy, entries: str) -> RevisionTrust:
    return RevisionTrust(TrustSettings(policy, parse_trusted_signers(entries)))


def test_an_entry_takes_a_name_pins_and_several_prefixes(ca: TestCA) -> None:
    (signer,) = parse_trusted_signers(
        f'release={ca.path}; subject="CN=release-bot,O=Acme"; san=uri:spiffe://ci/x;'
        "prefix=team-a-;prefix=team-b-"
    )
    assert (signer.name, signer.path, signer.is_ca) == ("release", ca.path, True)
    assert signer.subject is not None
    assert signer.subject.rfc4514_string() == "CN=release-bot,O=Acme"
    assert signer.san == ("uri", "spiffe://ci/x")
    assert signer.prefixes == ("team-a-", "team-b-")


def test_one_file_may_back_several_entries_split_at_commas_outside_quotes(ca: TestCA) -> None:
    signers = parse_trusted_signers(
        f'a={ca.path};subject="CN=a,O=x";prefix=a-, b={ca.path};prefix=b-'
    )
    assert [(s.name, s.prefixes) for s in signers] == [("a", ("a-",)), ("b", ("b-",))]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ("colour=red", "unknown option 'colour' (expected subject=, san= or prefix=)"),
        ("prefix=", "prefix= needs a value"),
        ("prefix=Team-A/", "prefix 'Team-A/' can match no adapter name"),
        ("san=phone:123", "san 'phone:123' is not TYPE:VALUE with TYPE one of email, uri, dns"),
        ("subject=nonsense", "subject 'nonsense' is no RFC 4514 name"),
        ("san=dns:a.example;san=dns:b.example", "san= given twice"),
    ],
)
def test_a_bad_option_is_refused_naming_the_entry(ca: TestCA, options: str, problem: str) -> None:
    entry = f"ci={ca.path};{options}"
    with pytest.raises(ValueError, match=r"^trusted signer entry ") as refused:
        parse_trusted_signers(entry)
    assert repr(entry) in str(refused.value)
    assert problem in str(refused.value)


def test_a_certificate_pin_on_a_bare_key_is_refused(key: KeyPair) -> None:
    with pytest.raises(ValueError, match=r"subject= needs a CA certificate; .* is a public key"):
        parse_trusted_signers(f"ci={key.public};subject=CN=ci")


def test_an_unclosed_quote_is_refused(ca: TestCA) -> None:
    with pytest.raises(ValueError, match="a double quote is not closed"):
        parse_trusted_signers(f'ci={ca.path};subject="CN=ci')


def test_a_replica_refuses_a_signer_outside_its_prefixes(key: KeyPair) -> None:
    files = tiny_adapter()
    signature = sign_revision(RevisionKey("team-b-x", 1), hashed(files), key.private)
    trust = _trust(SignaturePolicy.REQUIRE, f"ci={key.public};prefix=team-a-")
    with pytest.raises(PermissionDenied, match="ci may sign only adapters whose names start"):
        trust.check_revision(_revision("team-b-x", signature))


def test_a_replica_refuses_a_tls_certificate_of_a_trusted_ca(ca: TestCA) -> None:
    tls = ca.issue("api.internal", usage=ExtendedKeyUsageOID.SERVER_AUTH)
    bundle = raw_certificate_bundle(tls, RevisionKey("alpha", 1), tiny_adapter())
    trust = _trust(SignaturePolicy.REQUIRE, str(ca.path))
    with pytest.raises(PermissionDenied, match="is not for code signing"):
        trust.check_revision(_revision("alpha", bundle))


def test_a_leaf_without_extended_key_usage_cannot_sign(ca: TestCA) -> None:
    bare = ca.issue("legacy-bot", usage=None)
    bundle = raw_certificate_bundle(bare, RevisionKey("alpha", 1), tiny_adapter())
    trust = _trust(SignaturePolicy.REQUIRE, str(ca.path))
    with pytest.raises(PermissionDenied, match="has no extended key usage"):
        trust.check_revision(_revision("alpha", bundle))


def test_a_leaf_is_checked_against_the_entry_of_its_own_ca(ca: TestCA, tmp_path: Path) -> None:
    other_ca = write_ca(tmp_path / "other", "other")
    bot = other_ca.issue("bot", sans=(x509.RFC822Name("bot@example.com"),))
    files = tiny_adapter()
    signature = sign_revision(RevisionKey("alpha", 1), hashed(files), bot.private, bot.certificate)
    # The pins match the entry of a CA that did not issue the leaf.
    trust = _trust(
        SignaturePolicy.REQUIRE, f"{ca.path};san=email:bot@example.com,{other_ca.path};prefix=beta-"
    )
    with pytest.raises(PermissionDenied, match="does not chain to a trusted CA"):
        trust.check_revision(_revision("alpha", signature))


@pytest.mark.parametrize(
    "bundle",
    [b'{"verificationMaterial":[]}', b"[]", b"not json", b'{"verificationMaterial":{}}'],
)
def test_a_malformed_bundle_is_invalid_argument_under_require(key: KeyPair, bundle: bytes) -> None:
    trust = _trust(SignaturePolicy.REQUIRE, f"ci={key.public}")
    with pytest.raises(InvalidArgument, match="no model-signing bundle"):
        trust.check_revision(_revision("alpha", bundle))


def test_a_malformed_bundle_under_warn_is_logged_and_unverified(
    key: KeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    trust = _trust(SignaturePolicy.WARN, f"ci={key.public}")
    with caplog.at_level(logging.WARNING, logger="loraserve.common.trust.policy"):
        assert trust.check_revision(_revision("alpha", b'{"verificationMaterial":[]}')) is None
    assert "no model-signing bundle" in caplog.text

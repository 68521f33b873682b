"""Signing material for tests: EC key pairs and a CA with signing certificates, as the
PEM files `adapterctl push --sign-key/--sign-cert` and `--trusted-signers` read; and a
store that requires revisions signed by the `ci` key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from loraserve.common.trust.policy import SignaturePolicy, TrustSettings
from loraserve.common.trust.signers import parse_trusted_signers
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import RunningStore, running_store


@dataclass(frozen=True)
class KeyPair:
    """A private key file and its public key file."""

    private: Path
    public: Path


def write_key_pair(directory: Path, name: str) -> KeyPair:
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private = directory / f"{name}.key"
    public = directory / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return KeyPair(private, public)


@dataclass(frozen=True)
class CertificateSigner:
    """A signing certificate (and its key) issued by `ca`."""

    private: Path
    certificate: Path
    ca: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_certificate_signer(
    directory: Path, subject: str, *, expired: bool = False
) -> CertificateSigner:
    """A CA and a code-signing certificate for `subject`; `expired` makes the
    certificate's validity end a day ago."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{subject} CA"))
        .issuer_name(_name(f"{subject} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=30))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    end = now - timedelta(days=1) if expired else now + timedelta(days=30)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=10))
        .not_valid_after(end)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CODE_SIGNING]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    private = directory / f"{subject}.key"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    certificate = directory / f"{subject}.crt"
    certificate.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    ca = directory / f"{subject}-ca.crt"
    ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return CertificateSigner(private, certificate, ca)


@pytest.fixture
def ci_key(tmp_path: Path) -> KeyPair:
    return write_key_pair(tmp_path / "keys", "ci")


@pytest.fixture
async def strict_store(s3_bucket: S3Bucket, ci_key: KeyPair) -> AsyncIterator[RunningStore]:
    """A store that requires revisions signed by the `ci` key."""
    trust = TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(f"ci={ci_key.public}"))
    async with running_store(s3_bucket, trust=trust) as store:
        yield store

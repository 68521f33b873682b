"""A test CA that issues several leaves: code-signing ones with chosen subjects and
subjectAltNames, and TLS server ones (the kind an internal CA also hands out), as
PEM files; and bundles signed with a leaf as model-signing itself signs, without
adapterctl's own checks of the certificate."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from loraserve.common.revisions.manifest import RevisionKey
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.pushes import hashed
from loraserve.testing.adapters.signers import CertificateSigner


def _key_usage(*, key_cert_sign: bool, key_encipherment: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@dataclass(frozen=True)
class TestCA:
    """A CA certificate (its PEM at `path`) and its key, issuing into `directory`."""

    __test__ = False  # not a pytest test class

    directory: Path
    path: Path
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    def issue(
        self,
        common_name: str,
        *,
        sans: tuple[x509.GeneralName, ...] = (),
        usage: x509.ObjectIdentifier | None = ExtendedKeyUsageOID.CODE_SIGNING,
    ) -> CertificateSigner:
        """A leaf for CN=`common_name` with `sans`: for code signing by default, a
        TLS server certificate with `usage=SERVER_AUTH`, no extended key usage at
        all with None."""
        now = datetime.now(UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        tls = usage == ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=30))
            .add_extension(_key_usage(key_cert_sign=False, key_encipherment=tls), critical=True)
        )
        if usage is not None:
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        private = self.directory / f"{common_name}.key"
        _write_key(private, key)
        certificate = self.directory / f"{common_name}.crt"
        certificate.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return CertificateSigner(private, certificate, self.path)


def write_ca(directory: Path, name: str) -> TestCA:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=30))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, key_encipherment=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}-ca.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return TestCA(directory, path, key, cert)


def raw_certificate_bundle(
    signer: CertificateSigner, key: RevisionKey, files: AdapterFiles
) -> bytes:
    """The bundle model-signing makes for `key` with `files` as `signer`'s holder,
    whatever the certificate is for: what a holder could send without adapterctl."""
    from model_signing._signing import sign_certificate
    from model_signing._signing.signing import Payload

    from loraserve.common.trust.signing import signing_manifest

    made: Any = sign_certificate.Signer(
        signer.private, signer.certificate, [signer.certificate]
    ).sign(Payload(signing_manifest(key, hashed(files))))
    return str(made.bundle.to_json()).encode()

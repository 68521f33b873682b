"""Signed revisions: OpenSSF model-signing bundles bound to `NAME@REV` and its files.

A signature is a model-signing (sigstore bundle v0.3) DSSE envelope over an in-toto
statement whose subject is named `NAME@REV` and whose resources are the revision's
files with their SHA-256, exactly as the manifest carries them. So:

- the signer hashes nothing twice: the digests adapterctl computed for the push are
  what it signs, and the store and the replicas compare what a signature covers with
  the digests the bytes were checked against (the store hashes every byte it receives,
  a replica every byte it downloads or reuses from disk);
- a signature names one adapter and one revision number, so an old signed revision's
  files cannot be replayed as another adapter, or as another revision of the same one;
- the bundle is the standard format: `model_signing verify` checks a directory holding
  just the pushed files against it.

model-signing's public API hashes a directory on disk; the store has the digests but no
directory, so this module uses its signer and verifier classes (`model_signing._signing`)
directly, pinned by the lock. Nothing else in loraserve imports model_signing.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography import exceptions as crypto_errors
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from loraserve.common.config.textlimits import MAX_SIGNATURE_BYTES
from loraserve.common.errors import InvalidArgument, PermissionDenied
from loraserve.common.revisions.manifest import FileInfo, RevisionKey
from loraserve.common.trust.signers import (
    TrustedSigner,
    code_signing_refusal,
    read_pem,
)

# The entries' parser lives with their syntax; services and tests know it from here.

# Entries' reasons for refusing a certificate named in the error, at most.
_SHOWN_REFUSALS = 3
_SERIALIZATION = {"method": "files", "hash_type": "sha256", "allow_symlinks": False}


def signing_manifest(key: RevisionKey, files: Iterable[FileInfo]) -> Any:
    """The model-signing manifest a signature of `key` with `files` covers."""
    from model_signing import manifest as ms_manifest
    from model_signing._hashing import hashing

    serialization_type = ms_manifest.SerializationType.from_args(dict(_SERIALIZATION))
    items = [
        ms_manifest.FileManifestItem(
            path=pathlib.PurePosixPath(f.name),
            digest=hashing.Digest("sha256", bytes.fromhex(f.sha256)),
        )
        for f in files
    ]
    return ms_manifest.Manifest(str(key), items, serialization_type)


def sign_revision(
    key: RevisionKey,
    files: Iterable[FileInfo],
    private_key: pathlib.Path,
    certificate: pathlib.Path | None = None,
) -> bytes:
    """The signature (bundle JSON) of `key` with `files`, made with an EC private key
    (PEM, unencrypted) or, with `certificate` (PEM), as that certificate's holder.
    InvalidArgument
    names a key or certificate that cannot be used."""
    from model_signing._signing import sign_certificate, sign_ec_key
    from model_signing._signing.signing import Payload

    check_signing_key(private_key, certificate)
    try:
        if certificate is None:
            signer: Any = sign_ec_key.Signer(private_key)
        else:
            # The certificate file is also the chain model-signing puts in the bundle
            # (it cannot load an empty one): the leaf, then any intermediates the
            # file holds after it. The verifier's trusted CA file holds the root.
            signer = sign_certificate.Signer(private_key, certificate, [certificate])
        signature = signer.sign(Payload(signing_manifest(key, files)))
    except ValueError as exc:
        raise InvalidArgument(f"cannot sign with {private_key}: {exc}") from None
    return str(signature.bundle.to_json()).encode()


def check_signing_key(path: pathlib.Path, certificate: pathlib.Path | None = None) -> None:
    """InvalidArgument (PermissionDenied for an expired certificate) naming why the
    key, or the certificate, cannot sign."""
    if certificate is not None:
        leaf = _certificates(read_pem(certificate, "certificate"), certificate)[0]
        _check_valid_now(leaf, str(certificate))
        if refusal := code_signing_refusal(leaf):
            raise InvalidArgument(
                f"{certificate}: certificate {leaf.subject.rfc4514_string()} {refusal}"
            )
    data = read_pem(path, "signing key")
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(
            f"signing key {path} is not an unencrypted PEM private key: {exc}"
        ) from None
    if not isinstance(loaded, ec.EllipticCurvePrivateKey):
        raise InvalidArgument(
            f"signing key {path} is a {type(loaded).__name__}; model signing needs an "
            "elliptic-curve key (P-256, P-384 or P-521)"
        )


def _certificates(data: bytes, source: pathlib.Path | str) -> list[x509.Certificate]:
    try:
        chain = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise InvalidArgument(f"{source}: no PEM certificate: {exc}") from None
    return chain


def _check_valid_now(cert: x509.Certificate, what: str, at: datetime | None = None) -> None:
    at = at or datetime.now(UTC)
    if at > cert.not_valid_after_utc:
        raise PermissionDenied(
            f"{what}: certificate {cert.subject.rfc4514_string()} expired on "
            f"{cert.not_valid_after_utc.isoformat()}"
        )
    if at < cert.not_valid_before_utc:
        raise PermissionDenied(
            f"{what}: certificate {cert.subject.rfc4514_string()} is not valid before "
            f"{cert.not_valid_before_utc.isoformat()}"
        )


class Verifier:
    """Checks signatures against a set of trusted keys and CA certificates, loaded once,
    and each entry's pins (signers.py)."""

    def __init__(self, signers: Sequence[TrustedSigner]) -> None:
        # Public key entries by model-signing's key hint; CA entries with the verifier
        # of their file (one per file, however many entries name it).
        self._keys: dict[str, list[tuple[TrustedSigner, Any]]] = {}
        self._cas: list[tuple[TrustedSigner, Any]] = []
        loaded: dict[pathlib.Path, Any] = {}
        for signer in signers:
            if signer.path not in loaded:
                loaded[signer.path] = _load_signer(signer)
            if signer.is_ca:
                self._cas.append((signer, loaded[signer.path][1]))
            else:
                hint, verifier = loaded[signer.path]
                self._keys.setdefault(hint, []).append((signer, verifier))

    def verify(
        self, signature: bytes, name: str, files: Iterable[FileInfo], at: datetime
    ) -> Signed:
        """Who signed, and the revision of `name` the signature names. Raises
        InvalidArgument for a malformed signature or one over other files or another
        adapter, PermissionDenied for a signer not trusted here (or not for `name`) or
        a certificate not valid at `at` (when the revision was pushed)."""
        bundle = _parse_bundle(signature, name)
        chain = bundle.verification_material.x509_certificate_chain
        if chain and chain.certificates:
            signer, signed = self._verify_certificate(bundle, name, at)
        else:
            signer, verifier = self._key_signer(bundle, name)
            signed = _verified_manifest(verifier, bundle, name, signer)
        return Signed(signer, _covered_revision(signed, name, files))

    def _key_signer(self, bundle: Any, name: str) -> tuple[str, Any]:
        public_key = bundle.verification_material.public_key
        hint = public_key.hint if public_key else None
        entries = self._keys.get(hint or "")
        if not entries:
            raise PermissionDenied(
                f"{name}: signed by key sha256:{(hint or 'unknown')[:16]}, which is not "
                "among the trusted signers"
            )
        refusals = []
        for signer, verifier in entries:
            if (refusal := signer.name_refusal(name)) is None:
                return signer.name, verifier
            refusals.append(refusal)
        raise PermissionDenied(f"{name}: {'; '.join(refusals)}")

    def _verify_certificate(self, bundle: Any, name: str, at: datetime) -> tuple[str, Any]:
        """The leaf's subject and the verified manifest, once an entry whose pins the
        leaf meets has the CA it chains to."""
        chain = bundle.verification_material.x509_certificate_chain.certificates
        try:
            leaf = x509.load_der_x509_certificate(chain[0].raw_bytes)
        except ValueError as exc:
            raise InvalidArgument(
                f"{name}: the signing certificate does not parse: {exc}"
            ) from None
        subject = leaf.subject.rfc4514_string()
        if not self._cas:
            raise PermissionDenied(
                f"{name}: signed by certificate {subject}, but no CA certificate is trusted"
            )
        _check_valid_now(leaf, name, at)
        if refusal := code_signing_refusal(leaf):
            raise PermissionDenied(f"{name}: certificate {subject} {refusal}")
        refusals = []
        chain_refusal: PermissionDenied | None = None
        for signer, verifier in self._cas:
            if refusal := signer.certificate_refusal(leaf, name):
                refusals.append(refusal)
                continue
            try:
                return subject, _verified_manifest(verifier, bundle, name, subject)
            except PermissionDenied as exc:
                # Not issued under this entry's CA; another entry may have it.
                chain_refusal = exc
        if chain_refusal is not None:
            raise chain_refusal
        raise PermissionDenied(
            f"{name}: certificate {subject} is not a trusted signer of it: {_joined(refusals)}"
        )


def _joined(refusals: Sequence[str]) -> str:
    """The entries' reasons, the first few: one per entry could be long."""
    shown = "; ".join(refusals[:_SHOWN_REFUSALS])
    hidden = len(refusals) - _SHOWN_REFUSALS
    return f"{shown}; and {hidden} more" if hidden > 0 else shown


def _load_signer(signer: TrustedSigner) -> tuple[str, Any]:
    """A trusted signer's file loaded: the key hint (empty for a CA) and its verifier."""
    from model_signing._signing import sign_certificate, sign_ec_key

    data = read_pem(signer.path, "trusted signer")
    try:
        if signer.is_ca:
            _certificates(data, signer.path)
            return "", sign_certificate.Verifier([signer.path])
        public = serialization.load_pem_public_key(data)
        verifier = sign_ec_key.Verifier(signer.path)
    except (ValueError, TypeError, InvalidArgument) as exc:
        raise ValueError(
            f"trusted signer {signer.path}: not an EC public key (PEM) or CA certificate: {exc}"
        ) from None
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # The bundle names its key by this digest (model-signing's key hint).
    return hashlib.sha256(pem).hexdigest(), verifier


def _malformed(key: str, problem: str) -> InvalidArgument:
    return InvalidArgument(f"{key}: the signature is no model-signing bundle: {problem[:200]}")


def _parse_bundle(signature: bytes, key: str) -> Any:
    from model_signing._signing import sign_sigstore_pb
    from sigstore_models.bundle import v1 as bundle_pb

    if len(signature) > MAX_SIGNATURE_BYTES:
        raise InvalidArgument(
            f"{key}: the signature is {len(signature)} bytes, over the limit of "
            f"{MAX_SIGNATURE_BYTES}"
        )
    try:
        data = json.loads(signature)
    except (ValueError, RecursionError) as exc:
        # RecursionError: 64 KiB of `[` nests deeper than the parser recurses.
        raise _malformed(key, f"not JSON: {type(exc).__name__}: {exc}") from None
    # Checked here: the parser below assumes the shapes it reads.
    if not isinstance(data, dict) or not isinstance(data.get("verificationMaterial"), dict):
        raise _malformed(key, "it must be a JSON object with a verificationMaterial object")
    data["verificationMaterial"].setdefault("tlogEntries", [])
    try:
        bundle = bundle_pb.Bundle.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _malformed(key, f"{type(exc).__name__}: {exc}") from None
    if bundle.media_type != sign_sigstore_pb._BUNDLE_MEDIA_TYPE or not bundle.dsse_envelope:
        raise InvalidArgument(f"{key}: the signature is no model-signing DSSE bundle")
    return bundle


def _verified_manifest(verifier: Any, bundle: Any, key: str, signer: str) -> Any:
    from model_signing._signing import sign_sigstore_pb
    from OpenSSL.crypto import X509StoreContextError

    try:
        return verifier.verify(sign_sigstore_pb.Signature(bundle))
    except X509StoreContextError as exc:
        raise PermissionDenied(
            f"{key}: the signing certificate does not chain to a trusted CA: {exc}"
        ) from None
    except (
        crypto_errors.InvalidSignature,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
    ) as exc:
        # model-signing reads the signed statement as it finds it: a statement of
        # another shape fails with whichever of these its first wrong access raises.
        raise InvalidArgument(
            f"{key}: the signature does not verify with {signer}'s key: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None


def _covered_revision(signed: Any, name: str, files: Iterable[FileInfo]) -> int:
    """The revision number the verified statement names, once it names `name` and
    covers exactly `files`."""
    signed_name, _, revision = str(signed.model_name).rpartition("@")
    if signed_name != name or not revision.isdigit() or int(revision) < 1:
        raise InvalidArgument(
            f"{name}: the signature is for {signed.model_name!r}, not a revision of {name!r}: "
            "a signature names one adapter and revision"
        )
    if signed.serialization_type.get("hash_type") != "sha256":
        raise InvalidArgument(f"{name}: the signature's files are not hashed with sha256")
    covered = {d.identifier: d.digest.digest_hex for d in signed.resource_descriptors()}
    actual = {f.name: f.sha256 for f in files}
    if covered != actual:
        differing = sorted(
            n for n in covered.keys() | actual.keys() if covered.get(n) != actual.get(n)
        )
        raise InvalidArgument(
            f"{name}: the signature covers other bytes than the revision's files "
            f"(differing: {', '.join(differing)})"
        )
    return int(revision)


@dataclass(frozen=True, slots=True)
class Signed:
    """A verified signature: who signed, and which revision number it names."""

    signer: str
    revision: int

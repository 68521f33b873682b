"""A deployment's signature policy: `--signature-policy` and `--trusted-signers`, and
their application to revisions (what the store checks at push, and a replica before it
routes a revision). The cryptography is loraserve.common.trust.signing's."""

from __future__ import annotations

import argparse
import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from loraserve.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.trust.signers import TrustedSigner, parse_trusted_signers
from loraserve.common.trust.signing import Signed, Verifier

log = logging.getLogger(__name__)


class SignaturePolicy(enum.Enum):
    """What a deployment does with revisions' signatures."""

    OFF = "off"  # not checked (a signature is still stored and shown)
    WARN = "warn"  # checked; a failure is logged, the revision still accepted
    REQUIRE = "require"  # checked; a failure refuses the revision


def parse_policy(value: str) -> SignaturePolicy:
    try:
        return SignaturePolicy(value)
    except ValueError:
        choices = ", ".join(p.value for p in SignaturePolicy)
        raise ValueError(f"signature policy must be one of {choices}, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class TrustSettings:
    """A service's `--signature-policy` and `--trusted-signers`."""

    policy: SignaturePolicy = SignaturePolicy.OFF
    signers: tuple[TrustedSigner, ...] = ()


def add_trust_flags(flag: Callable[..., None]) -> None:
    """The two signature flags, for a service's parser (`EnvFlags.add` bound to it)."""
    flag(
        "signature-policy",
        "signed revisions: off (not checked), warn (checked, failures logged), require "
        "(an unsigned or badly signed revision is refused)",
        SignaturePolicy.OFF.value,
        type=_policy_flag,
    )
    flag(
        "trusted-signers",
        "whose signatures are trusted, comma-separated entries [NAME=]PATH[;OPTION]...: "
        "PATH an EC public key or CA certificate (PEM; a CA's leaves need the codeSigning "
        "extended key usage); each OPTION narrows the entry: subject=DN (the leaf's "
        "subject, RFC 4514, as adapterctl revisions shows it), san=TYPE:VALUE (a "
        "subjectAltName of the leaf; TYPE email, uri or dns), prefix=PREFIX (repeatable: "
        "the adapter names it may sign start with one); a value holding a comma or "
        "semicolon goes in double quotes, e.g. "
        'rel=ca.pem;subject="CN=bot,O=Acme";prefix=team-a-',
        "",
        type=_signers_flag,
    )


def trust_settings_from_args(args: argparse.Namespace) -> TrustSettings:
    policy: SignaturePolicy = args.signature_policy
    signers: tuple[TrustedSigner, ...] = args.trusted_signers
    if policy is SignaturePolicy.REQUIRE and not signers:
        raise InvalidArgument("--signature-policy require needs --trusted-signers")
    return TrustSettings(policy, signers)


def _policy_flag(text: str) -> SignaturePolicy:
    try:
        return parse_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _signers_flag(text: str) -> tuple[TrustedSigner, ...]:
    try:
        signers = parse_trusted_signers(text)
        Verifier(signers)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return signers


class RevisionTrust:
    """A deployment's policy applied to revisions: what the store checks at push and
    a replica checks before it routes a revision."""

    def __init__(self, settings: TrustSettings) -> None:
        self.policy = settings.policy
        self._verifier = Verifier(settings.signers)

    def check(
        self, name: str, files: Iterable[FileInfo], signature: bytes, at: datetime
    ) -> Signed | None:
        """The verified signature, or None when unchecked or (under warn) not
        verified. Under require, raises FailedPrecondition for an unsigned revision
        and the verifier's error for a bad signature; under warn, logs them."""
        if self.policy is SignaturePolicy.OFF:
            return None
        try:
            if not signature:
                raise FailedPrecondition(
                    f"{name}: the revision is not signed, and signed revisions are required "
                    "here (--signature-policy require); push it with adapterctl push --sign-key"
                )
            return self._verifier.verify(signature, name, files, at)
        except (FailedPrecondition, InvalidArgument, PermissionDenied) as exc:
            self._refused(name, exc)
            return None

    def check_push(self, name: str, files: Sequence[FileInfo], signature: bytes) -> Signed | None:
        """`check` of a push's signature, now, against the digests its header declares
        (which the upload then holds every byte to)."""
        if signature and not all(f.sha256 for f in files):
            raise InvalidArgument(
                "a signed push must declare every file's sha256 in its header (the "
                "digests the signature covers)"
            )
        signed = self.check(name, files, signature, datetime.now(UTC))
        if signed is not None:
            log.info(
                "adapter.signature_verified name=%s rev=%d signer=%s",
                name,
                signed.revision,
                signed.signer,
            )
        return signed

    def check_revision(self, revision: Revision) -> Signed | None:
        """`check` of a committed revision, against the time it was pushed: the
        signature must also name this revision's number."""
        signed = self.check(
            revision.adapter_name, revision.files, revision.signature, revision.create_time
        )
        if signed is not None and signed.revision != revision.revision:
            exc = InvalidArgument(
                f"{revision.key}: the signature is for {revision.adapter_name}@"
                f"{signed.revision}: a signed revision cannot be replayed as another"
            )
            self._refused(revision.adapter_name, exc)
            return None
        return signed

    def _refused(
        self, name: str, exc: FailedPrecondition | InvalidArgument | PermissionDenied
    ) -> None:
        """Raises `exc` under require; under warn, logs it (the revision is accepted)."""
        if self.policy is SignaturePolicy.REQUIRE:
            raise exc
        log.warning("signature.unverified name=%s reason=%s", name, exc.message)

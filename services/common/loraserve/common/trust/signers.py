"""`--trusted-signers`: whose signatures a deployment trusts, and for which adapters.

Entries are comma-separated; each is

    [NAME=]PATH[;subject=DN][;san=TYPE:VALUE][;prefix=PREFIX]...

PATH is a PEM EC public key or CA certificate (NAME defaults to the file's stem).
Options narrow the entry; an entry trusts a signature only when all of them hold:

- `subject=DN`: the signing certificate's subject is exactly DN (RFC 4514, as
  `adapterctl revisions` shows it, e.g. `CN=release-bot,O=Acme`);
- `san=TYPE:VALUE`: the certificate carries this subjectAltName, TYPE one of `email`,
  `uri`, `dns` (e.g. `san=uri:spiffe://prod/ci/release`);
- `prefix=PREFIX` (repeatable): the adapter's name starts with one of these (e.g.
  `team-a-`); without one, any name.

`subject` and `san` need a CA entry (a bare key has no certificate). A value holding
`,` or `;` is written in double quotes (`subject="CN=bot,O=Acme"`); quotes are
removed, so a value cannot hold `"` itself. Several entries may name one file with
other options: a CA that issues for two teams is two entries. A CA entry's file holds
the CA certificate and any intermediates its leaves chain through.

Whatever the entry, a signing certificate must be for code signing (extended key usage
codeSigning), so that an internal CA's TLS certificates sign nothing.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.names import validate_adapter_name

# Key and certificate files are small; a bound keeps a wrong path (a model file) from
# being read whole.
MAX_KEY_FILE_BYTES = 64 * 1024
_SAN_TYPES: dict[str, type[x509.GeneralName]] = {
    "email": x509.RFC822Name,
    "uri": x509.UniformResourceIdentifier,
    "dns": x509.DNSName,
}


def read_pem(path: pathlib.Path, what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_KEY_FILE_BYTES:
            raise InvalidArgument(
                f"{what} {path} is {size} bytes, over {MAX_KEY_FILE_BYTES}: not a PEM key"
            )
        return path.read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"{what} {path}: cannot read: {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class TrustedSigner:
    """One entry of `--trusted-signers`: a public key, or a CA certificate whose
    code-signing leaves are trusted, with the entry's pins."""

    name: str
    path: pathlib.Path
    is_ca: bool
    # The leaf's subject must be this; None: any.
    subject: x509.Name | None = None
    # A subjectAltName the leaf must carry, (TYPE, VALUE) as written; None: any.
    san: tuple[str, str] | None = None
    # The adapter names this signer may sign start with one of these; (): any.
    prefixes: tuple[str, ...] = ()

    def name_refusal(self, adapter: str) -> str | None:
        """Why this entry may not sign `adapter`; None when it may."""
        if not self.prefixes or adapter.startswith(self.prefixes):
            return None
        allowed = " or ".join(self.prefixes)
        return f"{self.name} may sign only adapters whose names start with prefix {allowed}"

    def certificate_refusal(self, leaf: x509.Certificate, adapter: str) -> str | None:
        """Why this CA entry does not trust `leaf` to sign `adapter` (its chain aside);
        None when it does."""
        if self.subject is not None and leaf.subject != self.subject:
            return f"{self.name}: the subject is not {self.subject.rfc4514_string()}"
        if self.san is not None and not _has_san(leaf, *self.san):
            return f"{self.name}: no subjectAltName {self.san[0]}:{self.san[1]}"
        return self.name_refusal(adapter)


def _has_san(leaf: x509.Certificate, kind: str, value: str) -> bool:
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (x509.ExtensionNotFound, ValueError):
        return False
    values = [general.value for general in names if isinstance(general, _SAN_TYPES[kind])]
    if kind == "dns":
        return value.lower() in (v.lower() for v in values)
    return value in values


def code_signing_refusal(leaf: x509.Certificate) -> str | None:
    """Why `leaf` may not sign code at all (not for code signing); None when it may.
    A CA that also issues TLS certificates must not make every TLS key a signer."""
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "has no extended key usage; a signing certificate needs codeSigning"
    except ValueError as exc:
        return f"has extensions that do not parse: {exc}"
    if ExtendedKeyUsageOID.CODE_SIGNING not in usages:
        return "is not for code signing (its extended key usage lacks codeSigning)"
    try:
        key_usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return None
    if not key_usage.digital_signature:
        return "has a key usage without digitalSignature"
    return None


def parse_trusted_signers(value: str) -> tuple[TrustedSigner, ...]:
    """The entries of a `--trusted-signers` value (syntax above). Raises ValueError
    naming the bad entry."""
    return tuple(_parse_entry(entry) for entry in _split(value, ",") if entry.strip())


def _parse_entry(entry: str) -> TrustedSigner:
    target, *options = (part.strip() for part in _split(entry, ";"))
    name, sep, path_text = _unquote(target).partition("=")
    path = pathlib.Path(path_text if sep else name)
    try:
        data = read_pem(path, "trusted signer")
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None
    is_ca = b"CERTIFICATE-----" in data
    subject: x509.Name | None = None
    san: tuple[str, str] | None = None
    prefixes: list[str] = []
    for option in options:
        key, _, text = (part.strip() for part in _unquote(option).partition("="))
        if key not in ("subject", "san", "prefix"):
            raise _bad(entry, f"unknown option {key!r} (expected subject=, san= or prefix=)")
        if not text:
            raise _bad(entry, f"{key}= needs a value")
        if key == "prefix":
            prefixes.append(_prefix(entry, text))
            continue
        if not is_ca:
            raise _bad(entry, f"{key}= needs a CA certificate; {path} is a public key")
        if (subject if key == "subject" else san) is not None:
            raise _bad(entry, f"{key}= given twice; an entry pins one (use two entries)")
        if key == "subject":
            subject = _subject(entry, text)
        else:
            san = _san(entry, text)
    return TrustedSigner(name if sep else path.stem, path, is_ca, subject, san, tuple(prefixes))


def _bad(entry: str, problem: str) -> ValueError:
    return ValueError(f"trusted signer entry {entry.strip()!r}: {problem}")


def _subject(entry: str, text: str) -> x509.Name:
    try:
        return x509.Name.from_rfc4514_string(text)
    except ValueError as exc:
        raise _bad(entry, f"subject {text!r} is no RFC 4514 name: {exc}") from None


def _san(entry: str, text: str) -> tuple[str, str]:
    kind, sep, value = text.partition(":")
    if not sep or kind not in _SAN_TYPES or not value:
        raise _bad(entry, f"san {text!r} is not TYPE:VALUE with TYPE one of email, uri, dns")
    return kind, value


def _prefix(entry: str, text: str) -> str:
    # A prefix of a valid name is itself a valid name: one that is not would match none.
    try:
        return validate_adapter_name(text)
    except InvalidArgument as exc:
        raise _bad(entry, f"prefix {text!r} can match no adapter name: {exc.message}") from None


def _split(text: str, separator: str) -> Iterator[str]:
    """`text` split at `separator` outside double quotes (the quotes kept)."""
    quoted = False
    start = 0
    for index, char in enumerate(text):
        if char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            yield text[start:index]
            start = index + 1
    if quoted:
        raise ValueError(f"trusted signers {text.strip()!r}: a double quote is not closed")
    yield text[start:]


def _unquote(text: str) -> str:
    return text.replace('"', "")

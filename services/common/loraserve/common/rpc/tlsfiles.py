"""A server's TLS files, read again whenever they change, so a certificate renewed in
place (cert-manager, a kubelet secret volume swapping its files) is served to the next
connection without a restart. grpc asks before every handshake
(`grpc.dynamic_ssl_server_credentials`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int], ...]


def check_key_pair(key_pem: bytes, cert_pem: bytes) -> None:
    """Raises ValueError unless `key_pem` is the private key of `cert_pem`'s leaf."""
    # Imported here: every client imports this module, few ever serve TLS files, and
    # the X.509 modules are a sixth of adapterctl's start-up.
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(key_pem, None)
    leaf = x509.load_pem_x509_certificate(cert_pem)
    raw = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*raw) != leaf.public_key().public_bytes(*raw):
        raise ValueError("the private key is not the certificate's")


@dataclass
class CertificateFiles:
    """A server's certificate chain, key and client CA as files, read again whenever one
    of them changes (by size or modification time)."""

    cert: Path
    key: Path
    ca: Path | None
    _seen: Stamp = ()
    # The last failure, so one bad renewal is logged once, not at every handshake.
    _failed: tuple[Stamp, str] | None = None

    def load(self) -> grpc.ServerCertificateConfiguration:
        stamp = self._stamp()
        key, cert = self.key.read_bytes(), self.cert.read_bytes()
        check_key_pair(key, cert)
        configuration = grpc.ssl_server_certificate_configuration(
            [(key, cert)], root_certificates=self.ca.read_bytes() if self.ca else None
        )
        self._seen, self._failed = stamp, None
        return configuration

    def changed(self) -> grpc.ServerCertificateConfiguration | None:
        """The new configuration if a file changed since it was last read, else None.
        Files that cannot be read, or a key that is not the certificate's, keep the
        configuration in use (a renewal caught half-way is read at a later handshake)."""
        stamp: Stamp = ()
        try:
            stamp = self._stamp()
            if stamp == self._seen or (self._failed and self._failed[0] == stamp):
                return None
            configuration = self.load()
        except (OSError, ValueError) as exc:
            if self._failed != (stamp, str(exc)):
                log.warning("tls.reload_failed cert=%s error=%s", self.cert, exc)
            self._failed = (stamp, str(exc))
            return None
        log.info("tls.reloaded cert=%s", self.cert)
        return configuration

    def _stamp(self) -> Stamp:
        paths = (self.cert, self.key, *((self.ca,) if self.ca else ()))
        return tuple((p.stat().st_mtime_ns, p.stat().st_size) for p in paths)

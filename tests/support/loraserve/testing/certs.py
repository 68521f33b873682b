"""A throwaway certificate authority with a server and a client certificate, for mTLS tests.

`trustme` issues them: ECDSA keys, valid around now. The server certificate names
127.0.0.1 and localhost, where test servers listen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class CertFiles:
    """PEM files of a CA, a server certificate and a client certificate."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def mtls_flags(self) -> list[str]:
        """A server's flags to present the server certificate and require a client one."""
        return [
            "--tls-cert",
            str(self.server_cert),
            "--tls-key",
            str(self.server_key),
            "--tls-client-ca",
            str(self.ca_cert),
        ]


def make_certs(directory: Path) -> CertFiles:
    """Writes a CA and a server and a client certificate it signed into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("loraserve-test-client")
    files = CertFiles(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )
    ca.cert_pem.write_to_path(str(files.ca_cert))
    server.cert_chain_pems[0].write_to_path(str(files.server_cert))
    server.private_key_pem.write_to_path(str(files.server_key))
    client.cert_chain_pems[0].write_to_path(str(files.client_cert))
    client.private_key_pem.write_to_path(str(files.client_key))
    return files

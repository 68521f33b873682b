"""Which callers protected mode counts as local, from what grpcio and uvicorn report of
them, and when a server is in protected mode at all. Whatever does not parse is remote."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loraserve.common.rpc.protected import is_local_peer, is_loopback_host, peer_host
from loraserve.common.rpc.security import (
    ServerSecurity,
    Token,
    add_server_security_flags,
    server_security_from_args,
)


@pytest.mark.parametrize("peer", ["ipv4:127.0.0.1:50128", "ipv4:127.3.4.5:1"])
def test_an_ipv4_loopback_peer_is_local(peer: str) -> None:
    assert is_local_peer(peer)


@pytest.mark.parametrize("peer", ["ipv4:192.0.2.1:36116", "ipv4:10.0.0.1:1", "ipv4:0.0.0.0:1"])
def test_an_ipv4_peer_off_loopback_is_remote(peer: str) -> None:
    assert not is_local_peer(peer)


@pytest.mark.parametrize("peer", ["ipv6:%5B::1%5D:41824", "ipv6:[::1]:41824"])
def test_ipv6_loopback_is_local_url_encoded_as_grpcio_sends_it_or_not(peer: str) -> None:
    assert is_local_peer(peer)


@pytest.mark.parametrize("peer", ["ipv6:%5B2001:db8::1%5D:5", "ipv6:%5Bfe80::1%25eth0%5D:5"])
def test_an_ipv6_peer_off_loopback_is_remote(peer: str) -> None:
    assert not is_local_peer(peer)


def test_an_ipv4_mapped_loopback_peer_is_local() -> None:
    assert is_local_peer("ipv6:%5B::ffff:127.0.0.1%5D:5")


def test_an_ipv4_mapped_peer_off_loopback_is_remote() -> None:
    assert not is_local_peer("ipv6:%5B::ffff:192.0.2.1%5D:5")


@pytest.mark.parametrize("peer", ["unix:", "unix:/run/loraserve/grpc.sock", "unix-abstract:x"])
def test_a_unix_socket_peer_is_local(peer: str) -> None:
    assert is_local_peer(peer)


@pytest.mark.parametrize(
    "peer",
    [
        "",
        "garbage",
        "ipv4:",
        "ipv4:127.0.0.1",  # no port: the host would be "127.0.0"
        "ipv4:localhost:5",
        "ipv4:999.0.0.1:5",
        "ipv6:%5Bnot-an-address%5D:5",
        "tcp:127.0.0.1:5",
        "127.0.0.1:5",
    ],
)
def test_a_peer_that_does_not_parse_is_remote(peer: str) -> None:
    assert not is_local_peer(peer)


def test_the_host_of_a_peer_is_its_address_without_brackets_or_port() -> None:
    assert peer_host("ipv4:192.0.2.1:36116") == "192.0.2.1"
    assert peer_host("ipv6:%5B2001:db8::1%5D:5") == "2001:db8::1"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "::ffff:127.0.0.1"])
def test_an_http_client_on_loopback_is_local(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["192.0.2.1", "::ffff:192.0.2.1", "localhost", "", "0.0.0.0"])
def test_an_http_client_off_loopback_or_by_name_is_remote(host: str) -> None:
    assert not is_loopback_host(host)


def test_a_server_with_nothing_to_authenticate_by_is_in_protected_mode() -> None:
    assert ServerSecurity().loopback_only


@pytest.mark.parametrize(
    "security",
    [
        ServerSecurity(reader_tokens=(Token("r", "t"),)),
        ServerSecurity(writer_tokens=(Token("w", "t"),)),
        ServerSecurity(replica_tokens=(Token("p", "t"),)),
        ServerSecurity(tls_client_ca_file=Path("ca.pem")),
        ServerSecurity(insecure=True),
    ],
    ids=["reader", "writer", "replica", "client-ca", "insecure"],
)
def test_a_token_a_client_ca_or_insecure_turns_protected_mode_off(
    security: ServerSecurity,
) -> None:
    assert not security.loopback_only


@pytest.mark.parametrize(("environ", "argv"), [({"X_INSECURE": "1"}, []), ({}, ["--insecure"])])
def test_insecure_comes_from_its_flag_or_its_environment_variable(
    environ: dict[str, str], argv: list[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_server_security_flags(parser, "X", environ)
    assert server_security_from_args(parser.parse_args(argv)).insecure

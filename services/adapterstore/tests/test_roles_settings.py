"""The store's credentials as its settings take them: a replica token names its replica,
admin is a role of its own, tokens come from files or the environment, and every method
names the role it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.adapterstore.api.servicer import METHOD_ROLES, SERVICE_NAME
from loraserve.adapterstore.settings import parse_settings
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.errors import InvalidArgument

SERVE = ["serve", "--bucket", "adapters"]


def test_a_replica_token_that_names_no_replica_is_refused_at_start() -> None:
    with pytest.raises(InvalidArgument, match="each replica token must be PRINCIPAL:TOKEN"):
        parse_settings([*SERVE, "--replica-token", "shared-secret"], {})


def test_replica_tokens_name_their_replicas() -> None:
    settings = parse_settings([*SERVE, "--replica-token", "inference-0:s0,inference-1:s1"], {})
    assert [t.principal for t in settings.security.replica_tokens] == [
        "inference-0",
        "inference-1",
    ]


def test_admin_tokens_come_from_a_file(tmp_path: Path) -> None:
    tokens = tmp_path / "admin"
    tokens.write_text("oncall:a-secret\n")
    settings = parse_settings([*SERVE, "--admin-token-file", str(tokens)], {})
    (token,) = settings.security.admin_tokens
    assert (token.principal, token.secret) == ("oncall", "a-secret")


def test_admin_tokens_come_from_the_environment() -> None:
    settings = parse_settings(SERVE, {"ADAPTERSTORE_ADMIN_TOKEN": "oncall:a-secret"})
    assert [t.principal for t in settings.security.admin_tokens] == ["oncall"]


@pytest.mark.parametrize("prefix", ["replica/", "spiffe://loraserve/replica"])
def test_a_replica_uri_prefix_that_is_no_uri_ending_in_a_slash_is_refused(prefix: str) -> None:
    with pytest.raises(InvalidArgument, match="--replica-uri-prefix"):
        parse_settings([*SERVE, "--replica-uri-prefix", prefix], {})


def test_one_secret_for_two_roles_is_refused_at_start() -> None:
    argv = [*SERVE, "--reader-token", "dash:same", "--admin-token", "oncall:same"]
    with pytest.raises(InvalidArgument, match="configured twice"):
        parse_settings(argv, {})


def test_one_secret_for_two_replicas_is_refused_at_start() -> None:
    with pytest.raises(InvalidArgument, match="configured twice"):
        parse_settings([*SERVE, "--replica-token", "r1:same,r2:same"], {})


def test_a_replica_token_whose_secret_holds_a_colon_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="may not hold ':'"):
        parse_settings([*SERVE, "--replica-token", "zone:a:secret"], {})


def test_every_store_method_names_the_role_it_needs() -> None:
    service = pb.DESCRIPTOR.services_by_name["AdapterStoreService"]
    methods = {f"/{SERVICE_NAME}/{m.name}" for m in service.methods}
    assert methods == set(METHOD_ROLES)

"""adapterctl's command line: flags, environment, and the failures it reports
before talking to any server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from loraserve.adapterctl.cli import build_parser, run
from loraserve.adapterctl.commands.generate import sampling_params
from loraserve.adapterctl.failures import EXIT_UNREACHABLE, EXIT_USAGE
from loraserve.adapterctl.settings import (
    DEFAULT_INFERENCE_ADDRESS,
    DEFAULT_STORE_ADDRESS,
    CtlSettings,
    settings_from_args,
)
from loraserve.testing.adapters.ctl import buffers, ctl, write_adapter_dir


def _settings(argv: list[str], env: dict[str, str] | None = None) -> CtlSettings:
    return settings_from_args(build_parser(env or {}).parse_args(argv))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_defaults_point_at_local_servers() -> None:
    settings = _settings(["list"])
    assert settings.store_address == DEFAULT_STORE_ADDRESS
    assert settings.inference_address == DEFAULT_INFERENCE_ADDRESS
    assert settings.store_security.token is None
    assert settings.timeout_s is None


def test_environment_supplies_addresses_token_and_timeout() -> None:
    env = {
        "ADAPTERSTORE_ADDR": "store:1",
        "INFERENCE_ADDR": "infer:2",
        "ADAPTERCTL_TOKEN": "s3cret",
        "ADAPTERCTL_TIMEOUT": "2.5",
    }
    settings = _settings(["list"], env)
    assert (settings.store_address, settings.inference_address) == ("store:1", "infer:2")
    assert settings.store_security.token == "s3cret"
    assert settings.unary_timeout_s == 2.5


def test_flags_after_the_command_override_the_environment() -> None:
    settings = _settings(
        ["list", "--store", "flag:9", "--token", "flagtoken", "--json"],
        {"ADAPTERSTORE_ADDR": "env:1", "ADAPTERCTL_TOKEN": "envtoken"},
    )
    assert settings.store_address == "flag:9"
    assert settings.store_security.token == "flagtoken"
    assert settings.json


def test_token_file_is_read_and_stripped(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    settings = _settings(["list"], {"ADAPTERCTL_TOKEN_FILE": str(token_file)})
    assert settings.store_security.token == "from-file"


def test_inference_uses_the_store_token_unless_given_its_own() -> None:
    shared = _settings(["generate", "a", "p", "--token", "t1"])
    own = _settings(["generate", "a", "p", "--token", "t1", "--inference-token", "t2"])
    assert shared.inference_security.token == "t1"
    assert own.inference_security.token == "t2"
    assert own.store_security.token == "t1"


def test_secrets_are_not_in_the_settings_repr() -> None:
    assert "s3cret" not in repr(_settings(["list", "--token", "s3cret"]))


def test_sampling_params_set_only_the_flags_given() -> None:
    args = build_parser({}).parse_args(["generate", "a", "p", "--max-tokens", "5", "--seed", "7"])
    params = sampling_params(args)
    assert params.max_tokens == 5
    assert params.seed == 7
    assert not params.HasField("temperature")
    assert not params.HasField("top_p")


async def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert await run(["--help"], {}, buffers()) == 0
    assert "exit codes" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "required: COMMAND"),
        (["rollback", "a", "abc"], "argument REV: not an integer: 'abc'"),
        (["rollback", "a", "0"], "argument REV: must be at least 1"),
        (["watch", "--after", "-1"], "must not be negative"),
        (["revisions", "Bad_Name"], "invalid adapter name 'Bad_Name'"),
        (["generate", "hello"], 'use --base or "" for the base model'),
        (["generate", "a@x", "hello"], "revision must be a positive integer"),
        (["list", "--timeout", "0"], "must be positive"),
        (["list", "--tls-cert", "c.pem"], "certificate and key must be given together"),
    ],
)
async def test_usage_errors_print_one_line_and_exit_2(argv: list[str], message: str) -> None:
    result = await ctl(*argv)
    assert result.code == EXIT_USAGE
    assert result.out == ""
    assert result.err.count("\n") == 1
    assert result.err.startswith("adapterctl: error: ")
    assert message in result.err


async def test_push_of_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = await ctl("push", "alpha", str(tmp_path / "nope"))
    assert result.code == EXIT_USAGE
    assert result.err == f"adapterctl: error: {tmp_path / 'nope'}: no such directory\n"


async def test_push_of_a_directory_without_weights_names_the_missing_file(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    (tmp_path / "adapter_model.safetensors").unlink()
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    result = await ctl("push", "alpha", str(tmp_path))
    assert result.code == EXIT_USAGE
    assert "missing adapter_model.safetensors" in result.err
    assert "pickle weights" in result.err
    assert result.err.count("\n") == 1


async def test_unreachable_store_exits_3_naming_the_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    result = await ctl("list", "--store", address)
    assert result.code == EXIT_UNREACHABLE
    assert result.err.startswith(
        f"adapterctl: error: UNAVAILABLE: cannot reach the adapter store at {address}"
    )
    assert result.err.count("\n") == 1


async def test_push_to_unreachable_store_exits_3(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    result = await ctl("push", "alpha", str(tmp_path), "--store", f"127.0.0.1:{_closed_port()}")
    assert result.code == EXIT_UNREACHABLE
    assert result.out == ""


async def test_delete_without_yes_off_a_terminal_refuses() -> None:
    result = await ctl("delete", "alpha", "--store", f"127.0.0.1:{_closed_port()}")
    assert result.code == EXIT_USAGE
    assert "pass --yes" in result.err


async def test_declined_confirmation_deletes_nothing() -> None:
    # The store is unreachable: reaching it would exit 3, not 1.
    result = await ctl(
        "delete", "alpha", "--store", f"127.0.0.1:{_closed_port()}", stdin="n\n", tty=True
    )
    assert result.code == 1
    assert "not deleted: alpha" in result.err

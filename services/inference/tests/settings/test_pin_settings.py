"""`inference serve --pin-policy` and `--pin-idle` (issue 54, item 5): a production
default that serves only what the store routes, env fallbacks, bad values refused."""

from __future__ import annotations

import pytest

from loraserve.common.config.pins import PinPolicy, PinSettings
from loraserve.inference.settings import parse_settings

BASE = ["serve", "--model", "/models/Llama-3-8B", "--store", "store:50051"]


def test_the_default_pin_policy_serves_only_the_current_revision_and_the_candidate() -> None:
    settings = parse_settings(BASE, {}, "host-1")

    assert settings.pins == PinSettings(PinPolicy.ROLLOUT, idle_s=60.0)


def test_pin_flags_fall_back_to_the_environment() -> None:
    environ = {"INFERENCE_PIN_POLICY": "any", "INFERENCE_PIN_IDLE": "5"}

    settings = parse_settings(BASE, environ, "host-1")

    assert (settings.pins.policy, settings.pins.idle_s) == (PinPolicy.ANY, 5.0)


@pytest.mark.parametrize(
    ("argv", "environ", "problem"),
    [
        (["--pin-policy", "all"], {}, "--pin-policy: invalid choice: 'all'"),
        ([], {"INFERENCE_PIN_POLICY": "all"}, "--pin-policy: invalid choice from the environment"),
        (["--pin-idle", "-1"], {}, "--pin-idle: must be a finite number >= 0"),
    ],
    ids=["flag", "environment", "negative idle"],
)
def test_a_bad_pin_setting_is_a_usage_error_naming_the_flag(
    argv: list[str], environ: dict[str, str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings([*BASE, *argv], environ, "host-1")

    assert exited.value.code == 2
    assert problem in capsys.readouterr().err

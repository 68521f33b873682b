"""The shared flag helper: environment fallbacks and value checks."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

import pytest

from loraserve.common.config.flags import EnvFlags, fraction, non_negative_int, port, positive_int


def test_a_flag_falls_back_to_its_prefixed_variable_and_names_it_in_its_help() -> None:
    parser = argparse.ArgumentParser()
    flags = EnvFlags({"APP_MAX_LORAS": "8"}, "APP")
    flags.add(parser, "max-loras", "adapters at once", "4", type=positive_int)
    flags.add(parser, "listen", "address", "0.0.0.0:1")
    assert vars(parser.parse_args([])) == {"max_loras": 8, "listen": "0.0.0.0:1"}
    assert "adapters at once (env APP_MAX_LORAS)" in parser.format_help()


@pytest.mark.parametrize(
    ("check", "text", "message"),
    [
        (positive_int, "0", "must be at least 1, got 0"),
        (positive_int, "x", "not an integer: 'x'"),
        (non_negative_int, "-1", "must not be negative, got -1"),
        (fraction, "1.5", "must be in (0, 1], got 1.5"),
        (port, "65536", "not a port: 65536"),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_problem(
    check: Callable[[str], object], text: str, message: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(message)}$"):
        check(text)

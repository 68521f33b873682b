"""What every command line here shares: flags that fall back to environment
variables, and the checks of their values.

`EnvFlags(environ, "INFERENCE")` maps `--max-loras` to `INFERENCE_MAX_LORAS`. The
value checks are argparse `type=` functions: a bad value is a usage error that
names the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

_Number = TypeVar("_Number", int, float)


class EnvFlags:
    """Environment fallbacks for flags: `--NAME` reads `PREFIX_NAME` (dashes as
    underscores), so a container can be configured without a command line."""

    def __init__(self, environ: Mapping[str, str], prefix: str) -> None:
        self._environ = environ
        self.prefix = prefix

    def env_name(self, name: str) -> str:
        return f"{self.prefix}_{name.upper().replace('-', '_')}"

    def get(self, name: str, default: str | None = None) -> str | None:
        """The environment's value for flag `name`, else `default`."""
        value = self._environ.get(self.env_name(name))
        return value if value is not None else default

    def switch(self, name: str) -> bool:
        """The default of an on/off flag: on when its variable is 1, true or yes."""
        return self.get(name) in ("1", "true", "yes")

    def add(
        self,
        parser: argparse.ArgumentParser | argparse._ArgumentGroup,
        name: str,
        help_text: str,
        default: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Adds `--NAME` with its environment fallback, named at the end of its help."""
        parser.add_argument(
            f"--{name}",
            default=self.get(name, default),
            help=f"{help_text} (env {self.env_name(name)})",
            **kwargs,
        )


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, and a value of a flag with choices that came from its
    environment variable checked as one from the command line is (argparse checks only
    the latter): a usage error naming the flag."""
    args = parser.parse_args(list(argv))
    parsers = [parser]
    while parsers:
        current = parsers.pop()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
                continue
            value = getattr(args, action.dest, None)
            if action.choices is not None and value is not None and value not in action.choices:
                choices = ", ".join(map(repr, action.choices))
                current.error(
                    f"argument {'/'.join(action.option_strings)}: invalid choice from the "
                    f"environment: {value!r} (choose from {choices})"
                )
    return args


def _number(parse: Callable[[str], _Number], what: str, text: str) -> _Number:
    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def positive_int(text: str) -> int:
    value = _number(int, "an integer", text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(int, "an integer", text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(float, "a number", text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(float, "a number", text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {value}")
    return value


def fraction(text: str) -> float:
    value = _number(float, "a number", text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def port(text: str) -> int:
    value = _number(int, "an integer", text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {value}")
    return value

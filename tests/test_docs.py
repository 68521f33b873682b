"""The README's configuration tables are the servers' real flags."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from loraserve.adapterstore.settings import build_parser as store_parser
from loraserve.flagdoc import serve_flags, tables
from loraserve.inference.settings import build_parser as inference_parser

README = Path(__file__).resolve().parents[1] / "README.md"
PARSERS = {
    "adapterstore": (store_parser, "ADAPTERSTORE"),
    "inference": (inference_parser, "INFERENCE"),
}


@pytest.mark.parametrize("server", sorted(PARSERS))
def test_readme_table_matches_the_parser(server: str) -> None:
    match = re.search(
        rf"<!-- flags:{server} -->\n(.*?)\n<!-- /flags:{server} -->", README.read_text(), re.S
    )
    assert match, f"README has no flags:{server} table"
    assert match.group(1) == tables()[server], "run `python -m loraserve.flagdoc README.md`"


@pytest.mark.parametrize("server", sorted(PARSERS))
def test_every_documented_env_variable_sets_its_flag(server: str) -> None:
    build_parser, prefix = PARSERS[server]
    for flag in serve_flags(build_parser, prefix):
        expected: object
        if isinstance(flag.action, argparse._StoreTrueAction):
            value, expected = "1", True
        elif isinstance(flag.action, argparse._AppendAction):
            value, expected = "a=1", ["a=1"]
        else:
            value, expected = "7", "7"
        configured = {
            action.dest: action.default
            for action in _serve(build_parser({flag.env: value}))._actions
        }
        assert configured[flag.action.dest] == expected, f"{flag.env} does not set {flag.option}"


def _serve(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve: argparse.ArgumentParser = subparsers.choices["serve"]
    return serve

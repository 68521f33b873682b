"""The README's configuration tables are the servers' real flags."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from loraserve.adapterstore.settings import build_parser as store_parser
from loraserve.flagdoc import serve_flags, tables
from loraserve.inference.settings import build_parser as inference_parser

README = Path(__file__).resolve().parents[2] / "README.md"
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


_HOP = re.compile(r"`((?:adapterctl|adapterstore|clients|common|inference)/[\w/]+\.py):([\w.]+)`")
_ROOTS = {
    "adapterctl": "services/adapterctl/loraserve",
    "adapterstore": "services/adapterstore/loraserve",
    "clients": "services/common/loraserve",
    "common": "services/common/loraserve",
    "inference": "services/inference/loraserve",
}


def test_every_hop_of_the_architecture_names_a_function_that_exists() -> None:
    repo = Path(__file__).resolve().parents[2]
    text = (repo / "docs" / "architecture.md").read_text("utf-8")
    hops = _HOP.findall(text)
    assert len(hops) > 20
    missing = []
    for path, qualified in hops:
        source = (repo / _ROOTS[path.split("/")[0]] / path).read_text("utf-8")
        last = qualified.split(".")[-1]
        if not re.search(rf"^\s*(?:async def|def|class) {re.escape(last)}\b", source, re.M):
            missing.append(f"{path}:{qualified}")
    assert missing == []

"""The README's configuration tables, generated from the servers' real parsers.

`python -m loraserve.flagdoc README.md` rewrites them in place;
`tests/project/test_docs.py` fails when the README's copy differs, and checks that every
environment variable named in a table really sets its flag.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

_ENV_NOTE = re.compile(r"\s*\(env [A-Z0-9_]+(?:, [^)]*)?\)")


@dataclass(frozen=True)
class Flag:
    """One documented flag of a `serve` command."""

    option: str
    env: str
    default: str
    help: str
    action: argparse.Action


def env_name(prefix: str, option: str) -> str:
    """The environment variable that backs `option` (`--max-loras` → `INFERENCE_MAX_LORAS`)."""
    name = option.removeprefix("--").upper().replace("-", "_")
    return f"{prefix}_{'ENGINE_ARGS' if name == 'ENGINE_ARG' else name}"


def serve_flags(
    build_parser: Callable[[Mapping[str, str]], argparse.ArgumentParser], prefix: str
) -> Iterator[Flag]:
    """Every flag of the parser's `serve` command, with its env variable."""
    parser = build_parser({})
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = subparsers.choices["serve"]
    for action in serve._actions:
        if not action.option_strings or action.dest == "help":
            continue
        option = max(action.option_strings, key=len)
        default = "" if action.default in (None, [], False) else str(action.default)
        help_text = _ENV_NOTE.sub("", action.help or "").strip()
        yield Flag(option, env_name(prefix, option), default, help_text, action)


def markdown_table(flags: Iterator[Flag]) -> str:
    lines = ["| Flag | Environment | Default | Meaning |", "|---|---|---|---|"]
    for flag in flags:
        default = f"`{flag.default}`" if flag.default else ""
        meaning = flag.help.replace("|", "\\|")
        lines.append(f"| `{flag.option}` | `{flag.env}` | {default} | {meaning} |")
    return "\n".join(lines)


def tables() -> dict[str, str]:
    """Markdown tables by server name."""
    from loraserve.adapterstore.settings import build_parser as store_parser
    from loraserve.inference.settings import build_parser as inference_parser

    return {
        "adapterstore": markdown_table(serve_flags(store_parser, "ADAPTERSTORE")),
        "inference": markdown_table(serve_flags(inference_parser, "INFERENCE")),
    }


def update(text: str) -> str:
    """`text` with every `<!-- flags:NAME -->` block replaced by the current table."""
    for name, table in tables().items():
        block = f"<!-- flags:{name} -->\n{table}\n<!-- /flags:{name} -->"
        pattern = rf"<!-- flags:{name} -->\n.*?<!-- /flags:{name} -->"
        text = re.sub(pattern, block.replace("\\", "\\\\"), text, flags=re.S)
    return text


def main() -> int:
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m loraserve.flagdoc README.md\n")
        return 2
    path = Path(sys.argv[1])
    path.write_text(update(path.read_text()))
    return 0

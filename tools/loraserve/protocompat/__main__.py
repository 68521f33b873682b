"""`python -m loraserve.protocompat [--against REF] [--root .]`: one line per breaking
change of `proto/` against REF (default: the previous release in pyproject.toml).

Exit status 0 when compatible, 1 when anything breaks, 2 when the check cannot run (the
ref is not in this clone, a tree does not compile).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loraserve.protocompat import check
from loraserve.protocompat.descriptors import CompileError
from loraserve.protocompat.gitref import RefUnreadable, previous_release


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loraserve.protocompat", description=__doc__)
    parser.add_argument(
        "--against",
        metavar="REF",
        help="git ref to compare with (default: [tool.loraserve.compat] previous-release)",
    )
    parser.add_argument("--root", type=Path, default=Path("."), help="repository root")
    args = parser.parse_args(argv)
    try:
        ref = args.against or previous_release(args.root)
        report = check(args.root, ref)
    except (RefUnreadable, CompileError) as exc:
        sys.stderr.write(f"protocompat: cannot compare the contracts: {exc}\n")
        return 2
    for found in report.breaks:
        sys.stdout.write(f"{found}\n")
    against = f"{report.ref} ({report.commit[:12]})"
    if report.breaks:
        sys.stdout.write(f"{len(report.breaks)} breaking change(s) of proto/ against {against}\n")
        return 1
    sys.stdout.write(f"proto/ is compatible with {against}: compared {report.old.summary()}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

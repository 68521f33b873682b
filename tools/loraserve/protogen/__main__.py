"""`python -m loraserve.protogen`: regenerate the committed gRPC stubs."""

from __future__ import annotations

import sys
from pathlib import Path

from loraserve.protogen import generate


def main() -> int:
    repo_root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    for path in generate(repo_root):
        sys.stdout.write(f"{path.relative_to(repo_root)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Generates the gRPC stubs from `proto/` into the source root of the service that owns
each contract (`loraserve.adapterstore.v1`, `loraserve.inference.v1`).

The stubs are committed so that a plain `pip install` needs no code generator;
`tests/project/test_protos.py` regenerates them and fails when the committed ones are stale.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

# Each contract's stubs live in its service's root, so every package has one root; the
# clients import them from there (the wheel installs every root).
PROTOS = {
    "loraserve/adapterstore/v1/adapterstore.proto": "services/adapterstore",
    "loraserve/inference/v1/inference.proto": "services/inference",
}
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(repo_root: Path, out_root: Path | None = None) -> list[Path]:
    """Generates every stub; under `out_root` (same relative paths) when given, else in place.

    Returns the generated files.
    """
    proto_root = repo_root / "proto"
    well_known = resources.files("grpc_tools") / "_proto"
    written: list[Path] = []
    for proto, out_dir in PROTOS.items():
        target = (out_root or repo_root) / out_dir
        target.mkdir(parents=True, exist_ok=True)
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={target}",
            f"--pyi_out={target}",
            f"--grpc_python_out={target}",
            str(proto_root / proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {proto}")
        package_dir = target / Path(proto).parent
        (package_dir / "__init__.py").touch()
        written.extend(
            p for p in sorted(package_dir.iterdir()) if p.name.endswith(GENERATED_SUFFIXES)
        )
    return written


def stale_files(repo_root: Path) -> list[str]:
    """Names the committed stubs that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(repo_root, Path(tmp))
        stale = []
        for path in fresh:
            committed = repo_root / path.relative_to(tmp)
            if not committed.exists() or committed.read_bytes() != path.read_bytes():
                stale.append(str(committed.relative_to(repo_root)))
        return stale

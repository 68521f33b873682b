"""Generates the gRPC stubs from `proto/` into the shared source root.

The stubs are committed so that a plain `pip install` needs no code generator;
`tests/test_protos.py` regenerates them and fails when the committed ones are stale.
"""

from __future__ import annotations

import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

# Both contracts are generated into the shared root, which both services and every client
# import; `loraserve.adapterstore` and `loraserve.inference` span it and their own root.
PROTOS = ("loraserve/adapterstore/v1/adapterstore.proto", "loraserve/inference/v1/inference.proto")
OUT_DIR = "services/common"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(repo_root: Path, out_root: Path | None = None) -> list[Path]:
    """Generates every stub; into `out_root/services/common` when given, else in place.

    Returns the generated files.
    """
    proto_root = repo_root / "proto"
    well_known = resources.files("grpc_tools") / "_proto"
    written: list[Path] = []
    target = (out_root or repo_root) / OUT_DIR
    target.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS:
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

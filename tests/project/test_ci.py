"""What `.ci/run` tells at the end of every run: each phase's time, the native
transport's state, and the slowest test modules. `.ci/run` runs here against a `make`
that only records what it was asked (on PATH ahead of the real one), so each branch of
the script is taken without building anything."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_MAKE = """#!/bin/sh
echo "make $1 LORASERVE_REQUIRE_NATIVE=${LORASERVE_REQUIRE_NATIVE:-}" >> "$CALLS"
case "$1" in
  native) exit "${NATIVE_STATUS:-0}" ;;
  test) exit "${TEST_STATUS:-0}" ;;
esac
"""


def _ci(tmp_path: Path, **statuses: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Runs a copy of `.ci/run` as root with apt-get found (the branch CI takes)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("make", FAKE_MAKE),
        ("apt-get", "#!/bin/sh\n"),
        ("id", "#!/bin/sh\necho 0\n"),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), **statuses}
    env.pop("LORASERVE_REQUIRE_NATIVE", None)
    done = subprocess.run(
        ["bash", str(tmp_path / ".ci" / "run")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    return done, calls.read_text().splitlines()


# What `make test` runs the workers with, and each test's outcome on its own line.
_LOADFILE = ("--dist", "loadfile", "--no-loadscope-reorder", "-v")


def _pytest(root: Path, plugin: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A pytest run in `root` (its own rootdir, no cache) with one of the project's
    plugins (`loraserve.testing.plugins.PLUGIN`) and `args`, and none of the options
    this run was given through the environment."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", f"loraserve.testing.plugins.{plugin}"),
            *("-p", "no:cacheprovider", "--rootdir", str(root), *args),
        ],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        check=False,
    )


def test_ci_ends_with_every_phase_timed_and_the_native_transport_required(tmp_path: Path) -> None:
    done, calls = _ci(tmp_path)
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-8:]
    assert last[0] == "=== CI phases ==="
    assert [line.split()[-1] for line in last[1:6]] == [
        "setup",
        "native",
        "haproxy",
        "lint",
        "test",
    ]
    assert "whole run, exit status 0" in last[6]
    assert last[7].startswith("native transport: built; its tests are required to run")
    # Setup installs the environment alone: the native build is timed as its own phase.
    assert [call.split()[1] for call in calls[:2]] == ["venv", "native"]
    # Where it built, the tests run with the requirement: a skipped native test fails.
    assert "make test LORASERVE_REQUIRE_NATIVE=1" in calls


def test_ci_says_at_its_end_that_the_native_transport_did_not_build(tmp_path: Path) -> None:
    done, calls = _ci(tmp_path, NATIVE_STATUS="2")
    assert done.returncode == 0, done.stderr
    assert "native (failed: exit status 2)" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("native transport: make native FAILED")
    assert "make test LORASERVE_REQUIRE_NATIVE=" in calls


def test_ci_fails_with_its_summary_when_the_tests_fail(tmp_path: Path) -> None:
    done, _ = _ci(tmp_path, TEST_STATUS="1")
    assert done.returncode == 1
    assert "test (failed: exit status 1)" in done.stdout
    assert "whole run, exit status 1" in done.stdout


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_names_its_slowest_modules_slowest_first(tmp_path: Path, workers: str) -> None:
    (tmp_path / "test_quick.py").write_text("def test_quick():\n    pass\n")
    # The sleep is what is measured: this module must come out slower.
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(0.5)\n")
    done = _pytest(tmp_path, "durations", "-n", workers, str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.split("slowest modules", 1)[1].splitlines()[1:]
    slowest, next_slowest = [line.split() for line in summary if line.strip()][:2]
    assert (slowest[-1], next_slowest[-1]) == ("test_slow.py", "test_quick.py")
    assert float(slowest[0]) >= 0.5


def test_a_run_writes_every_modules_seconds_where_asked(tmp_path: Path) -> None:
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text("def test_it():\n    pass\n")
    record = tmp_path / "durations.json"
    done = _pytest(tmp_path, "durations", str(tmp_path), f"--record-module-durations={record}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(json.loads(record.read_text())) == ["test_a.py", "test_b.py"]


def test_modules_are_handed_out_longest_first_by_their_recorded_seconds(tmp_path: Path) -> None:
    for name in ("test_a.py", "test_b.py", "test_c.py", "test_new.py"):
        (tmp_path / name).write_text("def test_it():\n    pass\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "module_durations.json").write_text(
        json.dumps({"test_b.py": 30.0, "test_c.py": 3.0, "test_a.py": 1.0})
    )
    done = _pytest(tmp_path, "scheduling", *_LOADFILE, "-n", "1", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split("::")[0].split()[-1] for line in done.stdout.splitlines() if "PASSED" in line]
    # test_b's 30 s make it slow; the rest by seconds, the one not recorded last.
    assert ran == ["test_b.py", "test_c.py", "test_a.py", "test_new.py"]


def _fleet_suite(root: Path, stray: bool = False) -> subprocess.CompletedProcess[str]:
    """A suite whose two fleet modules and two others ask for a `process_fleet` of their own
    making, run on two workers."""
    (root / "tests" / "reliability").mkdir(parents=True)
    (root / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='session')\ndef process_fleet():\n"
        "    return 'fleet'\n"
    )
    uses = "def test_it(process_fleet):\n    pass\n"
    (root / "tests" / "test_fleet.py").write_text(uses)
    (root / "tests" / "reliability" / "test_tracing_fleet.py").write_text(uses)
    for name in ("test_a.py", "test_b.py"):
        (root / "tests" / name).write_text(uses if stray else "def test_it():\n    pass\n")
    return _pytest(root, "scheduling", *_LOADFILE, "-n", "2", "tests")


def test_the_fleets_modules_run_on_one_worker_the_killing_one_last(tmp_path: Path) -> None:
    done = _fleet_suite(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split() for line in done.stdout.splitlines() if "PASSED" in line]
    fleet = [(words[0], words[-1]) for words in ran if "fleet" in words[-1]]
    assert [module for _, module in fleet] == [
        "tests/reliability/test_tracing_fleet.py::test_it",
        "tests/test_fleet.py::test_it",
    ]
    assert fleet[0][0] == fleet[1][0]


def test_a_module_that_asks_for_the_fleet_unlisted_fails_the_run(tmp_path: Path) -> None:
    done = _fleet_suite(tmp_path, stray=True)
    assert done.returncode != 0
    assert "tests/test_a.py uses process_fleet but is not in" in done.stdout
    assert "2 passed, 2 errors" in done.stdout

"""`adapterctl push --watch` against a real store, in-process and as a real process."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import signal
import sys
from pathlib import Path

from loraserve.adapterctl.cli import run
from loraserve.adapterctl.failures import EXIT_INTERRUPTED
from loraserve.testing.adapters.ctl import buffers, ctl, output, write_adapter_dir
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import eventually

WEIGHTS = "adapter_model.safetensors"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _weights_sha256_by_revision(store: RunningStore, name: str) -> dict[int, str]:
    result = await ctl("revisions", name, "--json", env={"ADAPTERSTORE_ADDR": store.address})
    return {
        r["revision"]: next(f["sha256"] for f in r["files"] if f["name"] == WEIGHTS)
        for r in json.loads(result.out)["revisions"]
    }


async def test_push_watch_publishes_one_revision_per_settled_change(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path, seed=0)
    second, third = tiny_adapter(seed=1)[WEIGHTS], tiny_adapter(seed=2)[WEIGHTS]
    console = buffers()
    argv = ["push", "alpha", str(adapter), "--watch", "--settle", "0.2"]
    task = asyncio.create_task(run(argv, {"ADAPTERSTORE_ADDR": store_server.address}, console))

    def published() -> list[str]:
        return output(console.stdout).splitlines()

    try:
        await eventually(lambda: published() == ["alpha@1"], "the initial push")
        # A slow writer: half the file, a pause the watcher sees settle, then the rest.
        with (adapter / WEIGHTS).open("wb") as f:
            f.write(second[: len(second) // 2])
        await eventually(lambda: "not pushing alpha" in output(console.stderr), "the refusal")
        with (adapter / WEIGHTS).open("ab") as f:
            f.write(second[len(second) // 2 :])
        await eventually(lambda: published() == ["alpha@1", "alpha@2"], "the second revision")
        # A second change, written in many small pieces.
        with (adapter / WEIGHTS).open("wb") as f:
            for start in range(0, len(third), 512):
                f.write(third[start : start + 512])
                f.flush()
        await eventually(lambda: published()[-1:] == ["alpha@3"], "the third revision")
        # Rewriting the same bytes is a change on disk but not in content.
        (adapter / WEIGHTS).write_bytes(third)
        await eventually(
            lambda: "unchanged since alpha@3" in output(console.stderr), "the skipped rewrite"
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert published() == ["alpha@1", "alpha@2", "alpha@3"]
    assert await _weights_sha256_by_revision(store_server, "alpha") == {
        1: _sha256(tiny_adapter(seed=0)[WEIGHTS]),
        2: _sha256(second),
        3: _sha256(third),
    }


# Runs adapterctl with SIGINT at its default. A suite launched in the background starts
# with SIGINT ignored, and a child inherits that: the Ctrl-C tests would then test how
# they were launched. A launcher does it, not `preexec_fn`: that makes Python fork this
# test process, where grpc runs, instead of vfork-ing it, and grpc's fork handlers then
# restart its poller in the child, which aborts ("epoll_wait error: Bad file
# descriptor") once the inherited descriptors are closed before exec: a third of the
# runs on a loaded machine.
_LAUNCHER = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'loraserve.adapterctl', *sys.argv[1:]])"
)


async def _cli_process(*argv: str, store: RunningStore) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _LAUNCHER,
        *argv,
        "--store",
        store.address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )


async def test_push_as_a_process_prints_name_at_revision(
    store_server: RunningStore, tmp_path: Path
) -> None:
    process = await _cli_process(
        "push", "alpha", str(write_adapter_dir(tmp_path)), store=store_server
    )
    stdout, stderr = await process.communicate()
    assert (process.returncode, stdout, stderr) == (0, b"alpha@1\n", b"")


async def test_ctrl_c_stops_push_watch_quietly_with_exit_130(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    process = await _cli_process("push", "alpha", str(adapter), "--watch", store=store_server)
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 60) == b"alpha@1\n"
    process.send_signal(signal.SIGINT)
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == EXIT_INTERRUPTED
    assert b"Traceback" not in stderr
    assert b"error" not in stderr


async def _reading(process: asyncio.subprocess.Process, path: Path) -> None:
    """Waits until `process` has `path` open: it is hashing it."""

    def has_open() -> bool:
        fds = Path(f"/proc/{process.pid}/fd")
        return any(_link(fd) == str(path) for fd in fds.iterdir())

    await eventually(has_open, f"the CLI to open {path.name}", guard_s=60)


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:  # closed meanwhile
        return ""


async def test_ctrl_c_while_hashing_a_huge_adapter_exits_130_at_once(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    # 1 TiB of holes: minutes of hashing that take no disk. Ctrl-C must not wait for it.
    huge = adapter / "README.md"
    with huge.open("wb") as f:
        f.truncate(1 << 40)
    process = await _cli_process("push", "alpha", str(adapter), "--watch", store=store_server)
    try:
        await _reading(process, huge)
        process.send_signal(signal.SIGINT)
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert (process.returncode, stdout) == (EXIT_INTERRUPTED, b"")
    assert b"Traceback" not in stderr
    assert b"error" not in stderr


async def test_push_watch_does_not_repush_the_latest_revision_on_restart(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    env = {"ADAPTERSTORE_ADDR": store_server.address}
    assert (await ctl("push", "alpha", str(adapter), "--no-promote", env=env)).code == 0
    console = buffers()
    argv = ["push", "alpha", str(adapter), "--watch", "--no-promote", "--settle", "0.2"]
    task = asyncio.create_task(run(argv, env, console))
    try:
        await eventually(
            lambda: "unchanged since alpha@1" in output(console.stderr), "the skipped start"
        )
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert output(console.stdout) == ""

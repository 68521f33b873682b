"""The run command end to end: `python -m loraserve.demo` (what `make run` runs) as a
subprocess brings up embedded S3, the store and the inference engine on the demo model,
serves demo adapters, takes a push, and leaves no process behind after Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from loraserve.clients.inference import Sampling, SyncInferenceClient
from loraserve.demo.showcase import SWAP_ADAPTER
from loraserve.testing.engine.session import ENGINE_ENV
from loraserve.testing.processes.services import free_port
from loraserve.testing.waiting import eventually
from loraserve.tiny.demo_model import build_demo

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1200)]

PROMPT = "Tell me about the sea."
GREEDY = Sampling(max_tokens=32, temperature=0.0)
READY_LINE = "Ctrl-C stops everything."
# Training (first run only) plus engine start on a busy 2-core machine.
READY_TIMEOUT_S = 900.0


@dataclass
class RunCommand:
    process: subprocess.Popen[str]
    store_address: str
    inference_address: str
    # Where the servers' logs are (--state-dir).
    state_dir: Path
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)

    def output(self) -> str:
        return "\n".join(self.lines)

    def read_output(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.strip() == READY_LINE:
                self.ready.set()
        self.ready.set()


@pytest.fixture(scope="module")
def run_command(
    pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory, demo_trained: Path
) -> Iterator[RunCommand]:
    root = pytestconfig.rootpath
    store_port, inference_port = free_port(), free_port()
    state_dir = tmp_path_factory.mktemp("run")
    argv = [
        sys.executable,
        "-m",
        "loraserve.demo",
        f"--store-port={store_port}",
        f"--inference-port={inference_port}",
        f"--cache-dir={demo_trained}",
        f"--state-dir={state_dir}",
        "--stop-timeout=30",
    ]
    process = subprocess.Popen(
        argv,
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **ENGINE_ENV},
    )
    run = RunCommand(process, f"127.0.0.1:{store_port}", f"127.0.0.1:{inference_port}", state_dir)
    threading.Thread(target=run.read_output, daemon=True).start()
    try:
        run.ready.wait(READY_TIMEOUT_S)
        if process.poll() is not None or READY_LINE not in run.lines:
            pytest.fail(f"the run command did not come up:\n{run.output()}")
        yield run
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _adapterctl(run: RunCommand, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "loraserve.adapterctl",
            *args,
            f"--store={run.store_address}",
            f"--inference={run.inference_address}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _served_revision(run: RunCommand, adapter: str, revision: int) -> str:
    """Generates until `adapter` is served at `revision` (the swap takes a moment)."""
    deadline = time.monotonic() + 120
    with SyncInferenceClient(run.inference_address) as client:
        while True:
            completion = client.generate(adapter, PROMPT, GREEDY, timeout=60)
            if completion.revision == revision or time.monotonic() > deadline:
                assert completion.revision == revision, completion
                return completion.text
            time.sleep(0.5)


def _shown(output: str, pattern: str) -> str:
    """The text the showcase printed where `pattern`'s group is; fails if it printed no
    such line."""
    found = re.search(pattern, output, re.MULTILINE)
    assert found is not None, f"no line matches {pattern!r} in:\n{output}"
    return found.group(1)


def _swap_order(log: str) -> tuple[int, int, int | None]:
    """Where in the inference log (line numbers) request 1 started, the pushed revision
    was routed, and request 1 ended (None: not yet). Request 1 is the last request on
    the first revision to start before the routing."""
    lines = log.splitlines()
    routed = next(
        (i for i, line in enumerate(lines) if f"adapter.routed name={SWAP_ADAPTER} rev=2 " in line),
        None,
    )
    assert routed is not None, f"{SWAP_ADAPTER}@2 was never routed:\n{log}"
    started = re.compile(rf"generate\.started request_id=(\S+) adapter={SWAP_ADAPTER} rev=1 ")
    first = [
        (i, m.group(1)) for i, line in enumerate(lines[:routed]) if (m := started.search(line))
    ]
    assert first, f"no request on {SWAP_ADAPTER}@1 started before @2 was routed:\n{log}"
    start, request_id = first[-1]
    ended = re.compile(rf"generate\.(finished|cancelled) request_id={re.escape(request_id)}\b")
    end = next((i for i, line in enumerate(lines) if ended.search(line)), None)
    return start, routed, end


async def test_showcase_shows_two_adapters_and_a_push_mid_stream(run_command: RunCommand) -> None:
    output = run_command.output()
    assert "matey" in output
    assert f"request 2, sent after the push, got {SWAP_ADAPTER}@2" in output
    assert f"pushed {SWAP_ADAPTER}@2; new requests go to it" in output
    assert f"request 1, still streaming from {SWAP_ADAPTER}@1 after the push" in output
    # The showcase reads request 1's first words before it pushes and the later ones only
    # once the inference service routes the pushed revision: words in both say request
    # 1's stream went on across the push, as the client saw it.
    before = _shown(output, rf"request 1 started on {SWAP_ADAPTER}@1: (.*)\.\.\.$")
    later = _shown(
        output,
        rf"request 1, still streaming from {SWAP_ADAPTER}@1 after the push: \.\.\.(.*)\.\.\.$",
    )
    assert before.strip(), output
    assert later.strip(), f"request 1 gave nothing after the push:\n{output}"
    # And as the server saw it, in the order its log records: request 1 began before
    # the push was routed and ended (the showcase closes it) only after.
    log_path = run_command.state_dir / "inference.log"
    await eventually(
        lambda: _swap_order(log_path.read_text())[2] is not None, "request 1's end is logged"
    )
    start, routed, end = _swap_order(log_path.read_text())
    assert end is not None
    assert start < routed < end, f"request 1 ended before the push was routed:\n{log_path}"


def test_adapterctl_generate_streams_a_demo_adapter(run_command: RunCommand) -> None:
    result = _adapterctl(
        run_command, "generate", "pirate", PROMPT, "--max-tokens=24", "--temperature=0"
    )
    assert result.returncode == 0, result.stderr
    assert "Arr" in result.stdout or "matey" in result.stdout


def test_two_demo_adapters_answer_one_prompt_differently(run_command: RunCommand) -> None:
    with SyncInferenceClient(run_command.inference_address) as client:
        pirate = client.generate("pirate", PROMPT, GREEDY, timeout=60)
        shout = client.generate("shout", PROMPT, GREEDY, timeout=60)
    assert pirate.text != shout.text
    assert shout.text.strip().isupper(), shout.text


def test_push_changes_what_an_adapter_answers(run_command: RunCommand, demo_trained: Path) -> None:
    shout_dir = build_demo(demo_trained).adapters["shout"]
    result = _adapterctl(run_command, "push", "pirate", str(shout_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "pirate@2"
    text = _served_revision(run_command, "pirate", 2)
    assert text.strip().isupper(), text


def test_sigint_stops_every_process_it_started(run_command: RunCommand) -> None:
    started = psutil.Process(run_command.process.pid).children(recursive=True)
    assert len(started) >= 3  # store, inference, the engine process
    run_command.process.send_signal(signal.SIGINT)
    assert run_command.process.wait(120) == 0, run_command.output()
    _, alive = psutil.wait_procs(started, timeout=30)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, alive
    assert "stopped." in run_command.output()

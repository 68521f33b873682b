"""The run command end to end: `python -m loraserve.demo` (what `make run` runs) as a
subprocess brings up embedded S3, the store and the inference engine on the demo model,
serves demo adapters, takes a push, and leaves no process behind after Ctrl-C."""

from __future__ import annotations

import os
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
    argv = [
        sys.executable,
        "-m",
        "loraserve.demo",
        f"--store-port={store_port}",
        f"--inference-port={inference_port}",
        f"--cache-dir={demo_trained}",
        f"--state-dir={tmp_path_factory.mktemp('run')}",
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
    run = RunCommand(process, f"127.0.0.1:{store_port}", f"127.0.0.1:{inference_port}")
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


def test_showcase_shows_two_adapters_and_a_push_mid_stream(run_command: RunCommand) -> None:
    output = run_command.output()
    assert "matey" in output
    assert f"request 2, sent after the push, got {SWAP_ADAPTER}@2" in output
    assert f"pushed {SWAP_ADAPTER}@2; new requests go to it" in output
    assert f"request 1, still streaming from {SWAP_ADAPTER}@1 after the push" in output


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

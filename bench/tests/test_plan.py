"""The dry run's command lines: the benchmark's competitor arms run vLLM with loraserve's
exact engine settings."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("engine", ["cpu", "gpu"])
def test_baselines_get_engine_a_settings(engine: str) -> None:
    """The dry run derives every server's flags as a run would, and fails if vLLM would
    parse the baselines' flags into engine arguments other than engine A's."""
    from bench.plan import plans

    commands = plans(engine)[8].servers
    serve = commands["vllm serve"]
    assert serve[serve.index("--max-loras") + 1] == "8"
    assert "--enable-lora" in commands["vLLM gRPC"]
    gpu_share = "--gpu-memory-utilization=0.15"
    assert (gpu_share in commands["inference serve (engine A, bench.rig.engine_host)"]) == (
        engine == "gpu"
    )
    engine_c = plans(engine)[3].servers["inference serve (engine C)"]
    assert "--max-loras=32" in engine_c

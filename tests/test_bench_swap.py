"""The swap benchmarks' bookkeeping: new weights every push, and no push dropped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from bench.load.workload import Record
from bench.rig.variants import CONFIG, WEIGHTS, write_variant
from bench.swap.hot import Push, swap_latencies


def _probe(revision: int, first_token: float) -> Record:
    return Record("swap", first_token - 0.01, first_token, first_token + 0.01, 1, revision)


def test_a_superseded_push_counts_as_unseen_and_takes_effect_with_its_successor() -> None:
    pushes = [Push(10.0, 10.1, 2), Push(11.0, 11.1, 3), Push(12.0, 12.1, 4)]
    probes = [_probe(2, 10.5), _probe(4, 12.25), _probe(4, 12.4)]

    latencies, unseen, missed = swap_latencies(pushes, probes)

    assert latencies == [0.5, 1.25, 0.25]
    assert (unseen, missed) == (1, 0)


def test_a_push_no_probe_ever_reflected_is_missed() -> None:
    latencies, unseen, missed = swap_latencies([Push(10.0, 10.1, 2)], [_probe(1, 10.5)])

    assert latencies == []
    assert (unseen, missed) == (1, 1)


def test_variants_keep_the_shapes_and_never_repeat_weights(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / CONFIG).write_text("{}")
    save_file({"a.lora_A.weight": np.zeros((8, 16), dtype=np.float32)}, str(source / WEIGHTS))

    first = load_file(str(write_variant(source, tmp_path / "v1", 1) / WEIGHTS))
    second = load_file(str(write_variant(source, tmp_path / "v2", 2) / WEIGHTS))

    assert first["a.lora_A.weight"].shape == (8, 16)
    assert first["a.lora_A.weight"].dtype == np.float32
    assert not np.array_equal(first["a.lora_A.weight"], second["a.lora_A.weight"])

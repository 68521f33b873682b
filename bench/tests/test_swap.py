"""The swap benchmarks' bookkeeping: new weights every push, no push dropped, and a
push's spans placed against its start."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from safetensors.numpy import load_file, save_file

from bench.load.workload import Record
from bench.rig.variants import CONFIG, WEIGHTS, write_variant
from bench.swap.hot import Push, swap_latencies
from bench.swap.push_spans import SpanTimes, span_times
from loraserve.testing.otlp import ReceivedSpan


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


def _span(name: str, trace: bytes, start_s: float, end_s: float) -> ReceivedSpan:
    nanos = 1_000_000_000
    span = Span(
        name=name,
        trace_id=trace,
        start_time_unix_nano=int(start_s * nanos),
        end_time_unix_nano=int(end_s * nanos),
    )
    return ReceivedSpan("loraserve-adapterstore", span)


def test_a_push_profile_places_each_span_name_from_the_push_start_and_sums_repeats() -> None:
    trace = bytes(range(16))
    spans = [
        _span("loraserve.store.push", trace, 100.5, 101.5),
        _span("loraserve.store.s3.upload_part", trace, 100.75, 101.0),
        _span("loraserve.store.s3.upload_part", trace, 101.0, 101.5),
    ]

    times = span_times(spans, started_unix_s=100.0)

    assert times["loraserve.store.push"] == SpanTimes(0.5, 1.0, 1)
    assert times["loraserve.store.s3.upload_part"] == SpanTimes(0.75, 0.75, 2)

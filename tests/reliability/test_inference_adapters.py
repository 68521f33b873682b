"""Rows 2, 3 and 6, inference side: what reaches the engine when an adapter is broken
or its download is.

A revision the server cannot serve (corrupt blob, rank above the engine's
max_lora_rank, modules the model lacks, tensor shapes that do not fit the model's
layers, another base model, NaN or infinite weights or an absurd scale written into
the bucket around the store) is NACKed to the store with its reason, and the previous
revision keeps serving. A download cut mid-way
is retried; the engine only ever loads a complete, verified directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from safetensors.numpy import load, save

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import (
    PROMPT,
    adapter_files,
)
from loraserve.testing.inference.stack import Stack
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.processes.services import health_status
from loraserve.testing.s3.aroundstore import commit_around_the_store
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault
from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    pass

pytestmark = [pytest.mark.faults, pytest.mark.engine]

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
DATA_LOSS = grpc.StatusCode.DATA_LOSS.value[0]
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]


def _with_weights(
    files: AdapterFiles, change: Callable[[dict[str, Any]], dict[str, Any]]
) -> AdapterFiles:
    return files | {WEIGHTS: save(change(load(files[WEIGHTS])))}


def _with_config(files: AdapterFiles, **fields: Any) -> AdapterFiles:
    return files | {CONFIG: json.dumps(json.loads(files[CONFIG]) | fields).encode()}


def _retargeted(files: AdapterFiles) -> AdapterFiles:
    """q_proj renamed to a module the Llama model does not have, consistently."""
    config = json.loads(files[CONFIG])
    config["target_modules"] = sorted(
        "c_attn" if m == "q_proj" else m for m in config["target_modules"]
    )
    renamed = _with_weights(
        files, lambda t: {k.replace(".q_proj.", ".c_attn."): v for k, v in t.items()}
    )
    return renamed | {CONFIG: json.dumps(config).encode()}


def _resized(files: AdapterFiles, module: str, side: str, columns: int, rows: int) -> AdapterFiles:
    """One layer's lora_A or lora_B cut or padded to another size, rank kept."""

    def change(tensors: dict[str, Any]) -> dict[str, Any]:
        name = f"base_model.model.model.layers.0.self_attn.{module}.lora_{side}.weight"
        tensors[name] = np.resize(tensors[name], (rows, columns)).astype(tensors[name].dtype)
        return tensors

    return _with_weights(files, change)


async def _still_serves_revision_one(serving_stack: Stack) -> None:
    revision, tokens = await serving_stack.inference.generate("alpha", 6)
    assert (revision, len(tokens)) == (1, 6)
    assert await serving_stack.inference.current("alpha") == 1
    assert (
        await health_status(serving_stack.inference.address)
        == health_pb2.HealthCheckResponse.SERVING
    )


async def test_corrupt_blob_is_nacked_with_data_loss_and_the_old_revision_keeps_serving(
    serving_stack: Stack,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    pytestconfig: pytest.Config,
) -> None:
    files = adapter_files(tiny_adapter(seed=2))
    await serving_stack.push("alpha", files, no_promote=True)
    flipped = bytearray(files[WEIGHTS])
    flipped[len(flipped) // 2] ^= 0x01
    key = blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())
    s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=key, Body=bytes(flipped))
    add_figure(pytestconfig, "faults.corrupt_blobs")
    await serving_stack.set_current("alpha", 2)
    report = await serving_stack.report("alpha", 2)
    assert report.type == store_pb.REPORT_TYPE_NACK
    assert (report.last_error.code, report.serving_revision) == (DATA_LOSS, 1)
    assert "alpha@2" not in serving_stack.inference.add_calls
    await _still_serves_revision_one(serving_stack)


async def test_s3_read_cut_mid_download_is_retried_and_the_engine_loads_the_whole_adapter(
    serving_stack: Stack,
    tiny_adapter: TinyAdapterFactory,
    tiny_model_dir: Path,
    tmp_path: Path,
    pytestconfig: pytest.Config,
) -> None:
    source = tiny_adapter(seed=2)
    files = adapter_files(source)
    key = blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())
    cut = serving_stack.proxy.add(
        Fault.CUT_RESPONSE, "GET", key, after_bytes=len(files[WEIGHTS]) // 2, times=2
    )
    await serving_stack.push("alpha", files)
    report = await serving_stack.report("alpha", 2)
    add_figure(pytestconfig, "faults.s3_cuts_mid_download", cut.hits)
    revision, tokens = await serving_stack.inference.generate("alpha", 8)
    expected = await asyncio.to_thread(greedy_tokens, tiny_model_dir, source, PROMPT, 8)
    assert cut.hits == 2
    assert report.type == store_pb.REPORT_TYPE_ACK
    assert serving_stack.inference.add_calls.count("alpha@2") == 1
    assert (revision, list(tokens)) == (2, expected)
    assert list((tmp_path / "cache" / ".tmp").glob("*")) == []


BAD_FOR_THE_MODEL: dict[str, tuple[Callable[[TinyAdapterFactory], AdapterFiles], str]] = {
    "rank-above-max-lora-rank": (lambda build: adapter_files(build(rank=32, seed=5)), "rank 32"),
    "module-the-model-lacks": (
        lambda build: _retargeted(adapter_files(build(seed=2))),
        "c_attn",
    ),
    "lora-a-narrower-than-its-layer": (
        lambda build: _resized(adapter_files(build(seed=2)), "q_proj", "A", columns=64, rows=8),
        "q_proj.lora_A.weight has shape [8, 64]",
    ),
    "lora-b-taller-than-its-layer": (
        lambda build: _resized(adapter_files(build(seed=2)), "v_proj", "B", columns=8, rows=256),
        "v_proj.lora_B.weight has shape [256, 8]",
    ),
    "another-base-model": (
        lambda build: _with_config(
            adapter_files(build(seed=2)), base_model_name_or_path="meta-llama/Llama-3.1-8B"
        ),
        "Llama-3.1-8B",
    ),
}


@pytest.mark.parametrize("case", BAD_FOR_THE_MODEL, ids=list(BAD_FOR_THE_MODEL))
async def test_adapter_incompatible_with_the_model_is_nacked_and_the_old_revision_keeps_serving(
    case: str, serving_stack: Stack, tiny_adapter: TinyAdapterFactory, pytestconfig: pytest.Config
) -> None:
    build, reason = BAD_FOR_THE_MODEL[case]
    await serving_stack.push("alpha", build(tiny_adapter))
    add_figure(pytestconfig, "bad_inputs.incompatible_adapters")
    report = await serving_stack.report("alpha", 2)
    assert report.type == store_pb.REPORT_TYPE_NACK
    assert report.last_error.code == FAILED_PRECONDITION
    assert reason in report.last_error.message
    assert "alpha@2" not in serving_stack.inference.add_calls
    await _still_serves_revision_one(serving_stack)


def _filled(part: str, value: float) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(tensors: dict[str, Any]) -> dict[str, Any]:
        return {k: np.full_like(v, value) if part in k else v for k, v in tensors.items()}

    return change


# Revisions the store would refuse at push, written into its bucket around it, and what
# the replica's NACK must say.
POISONED: dict[str, tuple[Callable[[AdapterFiles], AdapterFiles], str]] = {
    "nan-lora-b": (
        lambda files: _with_weights(files, _filled(".lora_B.", np.nan)),
        "lora_B.weight' holds NaN at element 0",
    ),
    "inf-lora-a": (
        lambda files: _with_weights(files, _filled(".lora_A.", np.inf)),
        "lora_A.weight' holds an infinity at element 0",
    ),
    "alpha-1e308": (
        lambda files: _with_config(files, lora_alpha=1e308),
        "lora_alpha = 1e+308 with r = 8 gives a LoRA scale (lora_alpha / r) of 1.25e+307",
    ),
}


@pytest.mark.parametrize("case", POISONED, ids=list(POISONED))
async def test_poisoned_revision_written_around_the_store_is_nacked_and_the_old_one_serves(
    case: str, serving_stack: Stack, tiny_adapter: TinyAdapterFactory, s3_bucket: S3Bucket
) -> None:
    poison, reason = POISONED[case]
    revision = await asyncio.to_thread(
        commit_around_the_store, s3_bucket, "alpha", poison(adapter_files(tiny_adapter(seed=2)))
    )
    report = await serving_stack.report("alpha", revision)
    assert report.type == store_pb.REPORT_TYPE_NACK
    assert report.last_error.code == FAILED_PRECONDITION
    assert f"adapter alpha@{revision}: " in report.last_error.message
    assert reason in report.last_error.message
    assert f"alpha@{revision}" not in serving_stack.inference.add_calls
    await _still_serves_revision_one(serving_stack)

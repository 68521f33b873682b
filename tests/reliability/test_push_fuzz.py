"""Row 6, fuzzing: random and mutated safetensors files and PEFT configs pushed through
the store's push path. No input may end any other way than success or
INVALID_ARGUMENT, and nothing is stored unless the input was a valid adapter, as
judged by the safetensors library itself (an independent parser). The other direction
too: every valid adapter is committed, whole, however it is cut into chunks; valid
ones are built as PEFT saves them (safetensors' own writer), varied in everything
the format allows.

Most examples run against the in-memory blob store for speed; a smaller number go
through real gRPC and S3 over HTTP. The number of inputs tried is written to the
terminal and recorded as a test property.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError
from safetensors.numpy import load, save

from loraserve.adapterstore.files.push import Chunk
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.testing.adapters.files import AdapterFiles, lora_config, tiny_adapter
from loraserve.testing.adapters.pushes import push, push_requests
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.store.stores import make_store

pytestmark = [pytest.mark.faults, pytest.mark.slow]

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
MEMORY_EXAMPLES = 1500
GRPC_EXAMPLES = 40
VALID_MEMORY_EXAMPLES = 300
VALID_GRPC_EXAMPLES = 20
# Where PEFT puts each LoRA target of a Llama decoder layer.
PROJECTIONS = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
# Fields PEFT writes beside the required ones, with values it writes.
OPTIONAL_CONFIG = {
    "task_type": st.sampled_from(["CAUSAL_LM", None]),
    "lora_dropout": st.floats(0.0, 0.5),
    "bias": st.just("none"),
    "fan_in_fan_out": st.just(False),
    "inference_mode": st.booleans(),
    "use_rslora": st.just(False),
    "revision": st.none(),
}
OPTIONAL_FILES = ["README.md", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


@pytest.fixture(scope="module")
def count(pytestconfig: pytest.Config) -> Callable[[str, str], None]:
    """Counts each input tried, by test and outcome, for the run's figures."""

    def add(test: str, outcome: str) -> None:
        add_figure(pytestconfig, f"fuzz.{test}.inputs_tried")
        add_figure(pytestconfig, f"fuzz.{test}.{outcome}")

    return add


def _header_of(weights: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack("<Q", weights[:8])
    return json.loads(weights[8 : 8 + length]), weights[8 + length :]


def _with_header(header: dict[str, Any], data: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + data


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)


@st.composite
def mutated_weights(draw: st.DrawFn, weights: bytes) -> bytes:
    if draw(st.booleans()):
        return weights
    kind = draw(
        st.sampled_from(["flip", "truncate", "extend", "length", "header-field", "drop", "random"])
    )
    if kind == "flip":
        flipped = bytearray(weights)
        for _ in range(draw(st.integers(1, 8))):
            flipped[draw(st.integers(0, len(flipped) - 1))] ^= draw(st.integers(1, 255))
        return bytes(flipped)
    if kind == "truncate":
        return weights[: draw(st.integers(0, len(weights) - 1))]
    if kind == "extend":
        return weights + draw(st.binary(min_size=1, max_size=64))
    if kind == "length":
        return struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + weights[8:]
    header, data = _header_of(weights)
    if kind == "header-field":
        name = draw(st.sampled_from(sorted(header)))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        header[name] = {**header[name], field: draw(json_values)}
        return _with_header(header, data)
    if kind == "drop":
        del header[draw(st.sampled_from(sorted(header)))]
        return _with_header(header, data)
    return draw(st.binary(max_size=256))


@st.composite
def mutated_config(draw: st.DrawFn, rank: int) -> bytes:
    config = json.loads(lora_config(rank))
    if draw(st.booleans()):
        return json.dumps(config).encode()
    kind = draw(st.sampled_from(["field", "drop", "random", "json"]))
    if kind == "field":
        key = draw(
            st.sampled_from(
                ["r", "lora_alpha", "target_modules", "peft_type", "base_model_name_or_path"]
            )
        )
        config[key] = draw(json_values | st.integers(-4, 1024))
    elif kind == "drop":
        del config[draw(st.sampled_from(sorted(config)))]
    elif kind == "random":
        return draw(st.binary(max_size=128))
    else:
        return json.dumps(draw(json_values)).encode()
    return json.dumps(config).encode()


@st.composite
def adapters(draw: st.DrawFn) -> AdapterFiles:
    rank = draw(st.sampled_from([1, 2, 4]))
    files = tiny_adapter(rank=rank, seed=draw(st.integers(0, 3)))
    files[WEIGHTS] = draw(mutated_weights(files[WEIGHTS]))
    files[CONFIG] = draw(mutated_config(rank))
    if draw(st.integers(0, 3)) == 0:
        extra = draw(
            st.sampled_from(["README.md", "adapter_model.bin", "x.pt", "model.pkl", "a/b", ""])
            | st.text(max_size=12)
        )
        files[extra] = draw(st.binary(max_size=32))
    return files


def _is_valid_adapter(files: AdapterFiles) -> bool:
    """The independent oracle: the safetensors library loads the weights, every tensor
    is a LoRA A/B of the config's integer rank."""
    try:
        tensors = load(files[WEIGHTS])
        config = json.loads(files[CONFIG])
    except (SafetensorError, ValueError, KeyError, UnicodeDecodeError):
        return False
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1 or not tensors:
        return False
    return all(
        (name.endswith(".lora_A.weight") and t.shape[0] == rank)
        or (name.endswith(".lora_B.weight") and t.shape[-1] == rank)
        for name, t in tensors.items()
    )


@st.composite
def valid_adapters(draw: st.DrawFn) -> AdapterFiles:
    """A PEFT LoRA adapter as PEFT saves one: any rank, projections, layers, sizes and
    float dtype; optional config fields and header metadata; optional tokenizer and
    README files of any content; the files in either order."""
    rank = draw(st.integers(1, 8))
    modules = draw(st.lists(st.sampled_from(sorted(PROJECTIONS)), min_size=1, unique=True))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tensors = {}
    for layer in range(draw(st.integers(1, 3))):
        for module in modules:
            prefix = f"base_model.model.model.layers.{layer}.{PROJECTIONS[module]}.{module}"
            fan_in, fan_out = draw(st.integers(1, 24)), draw(st.integers(1, 24))
            tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((rank, fan_in)).astype(dtype)
            tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((fan_out, rank)).astype(dtype)
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": draw(st.integers(1, 4 * rank) | st.floats(rank / 4, 4.0 * rank)),
        "target_modules": draw(st.permutations(modules)),
        "base_model_name_or_path": draw(
            st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,40}", fullmatch=True)
        ),
    }
    for field, values in OPTIONAL_CONFIG.items():
        if draw(st.booleans()):
            config[field] = draw(values)
    metadata = draw(st.none() | st.just({"format": "pt"}))
    files = {CONFIG: json.dumps(config).encode(), WEIGHTS: save(tensors, metadata=metadata)}
    for name in draw(st.lists(st.sampled_from(OPTIONAL_FILES), unique=True, max_size=2)):
        files[name] = draw(st.binary(max_size=64))
    return dict(reversed(files.items())) if draw(st.booleans()) else files


def _manifest_of(files: AdapterFiles) -> set[tuple[str, int, str]]:
    return {(name, len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items()}


async def _chunks(files: AdapterFiles, size: int) -> AsyncIterator[Chunk]:
    for name, data in files.items():
        for offset in range(0, len(data), size):
            yield Chunk(name, offset, data[offset : offset + size])


@settings(max_examples=MEMORY_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(files=adapters(), chunk_size=st.integers(1, 4096))
async def test_fuzzed_push_is_committed_only_if_valid_and_otherwise_invalid_argument(
    files: AdapterFiles, chunk_size: int, count: Callable[[str, str], None]
) -> None:
    blobs = MemoryBlobStore()
    store = make_store(blobs)
    await store.start()
    started = dict(blobs.objects)  # the start-up probe's object
    try:
        result = await push(store, "fuzz", files, chunks=_chunks(files, chunk_size))
    except InvalidArgument:
        count("memory", "invalid_argument")
        assert blobs.objects == started
        assert blobs.open_uploads == set()
        return
    finally:
        await store.close()
    count("memory", "committed")
    assert _is_valid_adapter(files), f"committed an invalid adapter: {result.revision}"
    assert {f.name for f in result.revision.files} == set(files)


@settings(
    max_examples=VALID_MEMORY_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(files=valid_adapters(), chunk_size=st.integers(1, 4096))
async def test_fuzzed_valid_adapter_is_committed_whole(
    files: AdapterFiles, chunk_size: int, count: Callable[[str, str], None]
) -> None:
    assert _is_valid_adapter(files)
    store = make_store(MemoryBlobStore())
    await store.start()
    try:
        result = await push(store, "fuzz", files, chunks=_chunks(files, chunk_size))
    finally:
        await store.close()
    count("valid_memory", "committed")
    assert {(f.name, f.size, f.sha256) for f in result.revision.files} == _manifest_of(files)


@settings(max_examples=VALID_GRPC_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(files=valid_adapters(), chunk_size=st.integers(1, 4096))
async def test_fuzzed_valid_adapter_over_grpc_and_s3_is_committed_whole(
    files: AdapterFiles,
    chunk_size: int,
    store_server: RunningStore,
    count: Callable[[str, str], None],
) -> None:
    async with store_stub(store_server.address) as stub:
        response = await stream_unary(
            stub.PushAdapter, push_requests("fuzz", files, chunk_size), timeout=30
        )
    count("valid_grpc_s3", "committed")
    stored = {(f.name, f.size, f.sha256) for f in response.revision.files}
    assert stored == _manifest_of(files)


@settings(max_examples=GRPC_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(files=adapters())
async def test_fuzzed_push_over_grpc_and_s3_is_committed_only_if_valid(
    files: AdapterFiles,
    store_server: RunningStore,
    s3_bucket: S3Bucket,
    count: Callable[[str, str], None],
) -> None:
    before = s3_bucket.keys()
    async with store_stub(store_server.address) as stub:
        code, details = await _push_outcome(stub, files)
    count("grpc_s3", "committed" if code is grpc.StatusCode.OK else code.name.lower())
    if code is grpc.StatusCode.OK:
        assert _is_valid_adapter(files), f"committed an invalid adapter: {details}"
    else:
        assert code is grpc.StatusCode.INVALID_ARGUMENT, details
        assert s3_bucket.keys() == before


async def _push_outcome(stub: Any, files: AdapterFiles) -> tuple[grpc.StatusCode, str]:
    try:
        response = await stream_unary(stub.PushAdapter, push_requests("fuzz", files), timeout=30)
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, str(response.revision)

"""Test support for the adapter store: tiny adapter files, push helpers, store fixtures.

The adapters are written with safetensors' own numpy writer, so the store's
validator is checked against what the real library produces.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
from safetensors.numpy import save

from loraserve.adapterstore.blobstore import BlobStore
from loraserve.adapterstore.changelog import ChangeLog, LogSettings
from loraserve.adapterstore.memblobs import MemoryBlobStore
from loraserve.adapterstore.push import Chunk, PushHeader
from loraserve.adapterstore.s3blobs import MIN_PART_SIZE, S3BlobStore, S3Location
from loraserve.adapterstore.servicer import (
    REPLICA_METHODS,
    SERVICE_NAME,
    WRITE_METHODS,
    AdapterStoreServicer,
    register,
)
from loraserve.adapterstore.status import DEFAULT_STATUS_TTL_S, ReplicaStatusStore
from loraserve.adapterstore.store import AdapterStore, PushResult, StoreSettings
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.adapterstore.validation import Limits
from loraserve.common.manifest import FileInfo
from loraserve.testing.grpc import serving
from loraserve.testing.s3 import S3Bucket

BASE_MODEL = "tiny-llama"
FAST_LOG = LogSettings(poll_interval=0.05, snapshot_every=100, log_retention=0)
TEST_LIMITS = Limits(max_file_size=64 * 1024 * 1024, max_adapter_size=128 * 1024 * 1024)

AdapterFiles = dict[str, bytes]


def lora_config(
    rank: int = 4, modules: tuple[str, ...] = ("q_proj", "v_proj"), **extra: Any
) -> bytes:
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(modules),
        "base_model_name_or_path": BASE_MODEL,
    }
    config.update(extra)
    return json.dumps(config).encode()


def lora_tensors(
    rank: int = 4,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    layers: int = 2,
    hidden: int = 16,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for module in modules:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((rank, hidden), np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((hidden, rank), np.float32)
    return tensors


def tiny_adapter(rank: int = 4, seed: int = 0, **extra_files: bytes) -> AdapterFiles:
    """A valid PEFT LoRA adapter's files, small enough for unit tests."""
    files = {
        "adapter_config.json": lora_config(rank),
        "adapter_model.safetensors": save(lora_tensors(rank, seed=seed)),
    }
    files.update(extra_files)
    return files


def declared(files: AdapterFiles) -> list[FileInfo]:
    return [FileInfo(name, len(data), "") for name, data in files.items()]


async def chunks_of(files: AdapterFiles, chunk_size: int = 1000) -> AsyncIterator[Chunk]:
    for name, data in files.items():
        for offset in range(0, len(data), chunk_size):
            yield Chunk(name, offset, data[offset : offset + chunk_size])


async def push(
    store: AdapterStore,
    name: str,
    files: AdapterFiles,
    *,
    no_promote: bool = False,
    header_files: list[FileInfo] | None = None,
    chunks: AsyncIterator[Chunk] | None = None,
    idempotency_key: str = "",
    description: str = "",
) -> PushResult:
    header = PushHeader(
        name, header_files or declared(files), no_promote, description, idempotency_key
    )
    return await store.push(header, chunks or chunks_of(files), "tester")


def make_store(
    blobs: BlobStore, log_settings: LogSettings = FAST_LOG, **kwargs: Any
) -> AdapterStore:
    statuses = ReplicaStatusStore(blobs, kwargs.pop("status_ttl_s", DEFAULT_STATUS_TTL_S))
    settings = StoreSettings(limits=kwargs.pop("limits", TEST_LIMITS), **kwargs)
    return AdapterStore(blobs, ChangeLog(blobs, log_settings), statuses, settings)


StoreFactory = Callable[..., Awaitable[AdapterStore]]


@pytest.fixture
async def open_store() -> AsyncIterator[StoreFactory]:
    """Starts stores on given blob stores and closes them after the test."""
    stores: list[AdapterStore] = []

    async def start(
        blobs: BlobStore, log_settings: LogSettings = FAST_LOG, **kwargs: Any
    ) -> AdapterStore:
        store = make_store(blobs, log_settings, **kwargs)
        await store.start()
        stores.append(store)
        return store

    yield start
    for store in stores:
        await store.close()


@pytest.fixture
def memory_blobs() -> MemoryBlobStore:
    return MemoryBlobStore()


@pytest.fixture
async def memory_store(memory_blobs: MemoryBlobStore, open_store: StoreFactory) -> AdapterStore:
    return await open_store(memory_blobs)


def raw_safetensors(header: dict[str, Any], data: bytes, length: int | None = None) -> bytes:
    """A safetensors file written by hand, so tests can break any part of it."""
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data


def _one_tensor(dtype: str, shape: list[int], offsets: list[int], data: bytes) -> bytes:
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    return raw_safetensors({name: {"dtype": dtype, "shape": shape, "data_offsets": offsets}}, data)


@dataclass(frozen=True)
class BadPush:
    """A push the store must refuse, and a fragment of the message it must give."""

    id: str
    files: AdapterFiles
    message: str
    header_files: list[FileInfo] | None = None
    chunks: list[Chunk] | None = None


def _with(**files: bytes) -> AdapterFiles:
    return tiny_adapter() | {k.replace("__", "."): v for k, v in files.items()}


def _without(name: str) -> AdapterFiles:
    return {k: v for k, v in tiny_adapter().items() if k != name}


def _weights_renamed(old: str, new: str) -> bytes:
    tensors = lora_tensors()
    return save({k.replace(old, new): v for k, v in tensors.items()})


def _weights_reshaped(name_part: str, shape: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(1)
    tensors = lora_tensors()
    for key in tensors:
        if name_part in key:
            tensors[key] = rng.standard_normal(shape, np.float32)
    return save(tensors)


def _valid_weights_header() -> tuple[dict[str, Any], bytes]:
    weights = tiny_adapter()["adapter_model.safetensors"]
    (length,) = struct.unpack("<Q", weights[:8])
    return json.loads(weights[8 : 8 + length]), weights[8 + length :]


def _weights_with_data(extra: int) -> bytes:
    header, data = _valid_weights_header()
    return raw_safetensors(header, data + b"\0" * extra if extra > 0 else data[:extra])


def _declared_with(name: str, **changes: Any) -> list[FileInfo]:
    return [
        FileInfo(**{"name": f.name, "size": f.size, "sha256": f.sha256, **changes})
        if f.name == name
        else f
        for f in declared(tiny_adapter())
    ]


WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
BAD_PUSHES = [
    BadPush("pickle-bin", _with(pytorch_model__bin=b"x"), "pickle-based format"),
    BadPush("pickle-pt", _with(adapter__pt=b"x"), "pickle-based format"),
    BadPush("pickle-pkl", _with(state__pkl=b"x"), "pickle-based format"),
    BadPush("unknown-file", _with(model__onnx=b"x"), "is not allowed"),
    BadPush("path-name", tiny_adapter() | {"../README.md": b"x"}, "paths are not allowed"),
    BadPush("missing-config", _without(CONFIG), "required file(s) missing: adapter_config.json"),
    BadPush("missing-weights", _without(WEIGHTS), f"required file(s) missing: {WEIGHTS}"),
    BadPush(
        "header-not-json",
        _with(adapter_model__safetensors=struct.pack("<Q", 4) + b"{abc"),
        "not valid JSON",
    ),
    BadPush(
        "header-too-long",
        _with(adapter_model__safetensors=struct.pack("<Q", 999) + b"{}"),
        "runs past the end",
    ),
    BadPush("file-too-short", _with(adapter_model__safetensors=b"abc"), "too short"),
    BadPush(
        "data-truncated",
        _with(adapter_model__safetensors=_weights_with_data(-4)),
        "data section has",
    ),
    BadPush(
        "data-trailing", _with(adapter_model__safetensors=_weights_with_data(4)), "data section has"
    ),
    BadPush(
        "offsets-gap",
        _with(adapter_model__safetensors=_one_tensor("F32", [1, 2], [8, 16], b"\0" * 16)),
        "leaves a gap",
    ),
    BadPush(
        "offsets-vs-shape",
        _with(adapter_model__safetensors=_one_tensor("F32", [2, 2], [0, 8], b"\0" * 8)),
        "needs 16",
    ),
    BadPush(
        "unknown-dtype",
        _with(adapter_model__safetensors=_one_tensor("Q4", [2], [0, 2], b"\0" * 2)),
        "unsupported dtype",
    ),
    BadPush(
        "not-lora", _with(adapter_config__json=lora_config(peft_type="PREFIX_TUNING")), "only LORA"
    ),
    BadPush("rank-zero", _with(adapter_config__json=lora_config(r=0)), "integer >= 1"),
    BadPush("rank-float", _with(adapter_config__json=lora_config(r=4.0)), "integer >= 1"),
    BadPush("config-not-json", _with(adapter_config__json=b"{"), "not valid JSON"),
    BadPush(
        "target-regex",
        _with(adapter_config__json=lora_config(target_modules=".*proj")),
        "explicit list of module names",
    ),
    BadPush(
        "no-base-model",
        _with(adapter_config__json=lora_config(base_model_name_or_path=None)),
        "base_model_name_or_path",
    ),
    BadPush(
        "module-not-targeted",
        _with(adapter_config__json=lora_config(modules=("q_proj",))),
        "not in target_modules",
    ),
    BadPush("rank-mismatch", _with(adapter_config__json=lora_config(rank=8)), "must be [8, in]"),
    BadPush(
        "lora-b-shape",
        _with(adapter_model__safetensors=_weights_reshaped("lora_B", (16, 3))),
        "must be [out, 4]",
    ),
    BadPush(
        "not-a-lora-tensor",
        _with(adapter_model__safetensors=_weights_renamed("lora_A.weight", "weight")),
        "is not a LoRA weight",
    ),
    BadPush(
        "size-mismatch-short",
        tiny_adapter(),
        "received",
        header_files=_declared_with(CONFIG, size=len(tiny_adapter()[CONFIG]) + 10),
    ),
    BadPush(
        "size-mismatch-long",
        tiny_adapter(),
        "more than the declared",
        header_files=_declared_with(CONFIG, size=len(tiny_adapter()[CONFIG]) - 10),
    ),
    BadPush(
        "sha256-mismatch",
        tiny_adapter(),
        "does not match",
        header_files=_declared_with(CONFIG, sha256="0" * 64),
    ),
    BadPush(
        "file-over-limit",
        tiny_adapter(),
        "exceeds the limit",
        header_files=_declared_with(WEIGHTS, size=TEST_LIMITS.max_file_size + 1),
    ),
    BadPush(
        "chunk-undeclared",
        tiny_adapter(),
        "not declared",
        chunks=[Chunk("README.md", 0, b"hello")],
    ),
    BadPush(
        "chunk-out-of-order",
        tiny_adapter(),
        "header order",
        chunks=[Chunk(WEIGHTS, 0, tiny_adapter()[WEIGHTS])],
    ),
    BadPush(
        "chunk-bad-offset",
        tiny_adapter(),
        "expected offset 0",
        chunks=[Chunk(CONFIG, 5, tiny_adapter()[CONFIG])],
    ),
]


def s3_location(bucket: S3Bucket, prefix: str = "") -> S3Location:
    return S3Location(
        bucket=bucket.bucket,
        prefix=prefix,
        endpoint_url=bucket.endpoint_url,
        region=bucket.region,
        access_key_id=bucket.access_key_id,
        secret_access_key=bucket.secret_access_key,
    )


@dataclass
class StoreServer:
    """A store served over gRPC on a loopback port, with a client stub."""

    store: AdapterStore
    address: str
    stub: pb_grpc.AdapterStoreServiceStub


@asynccontextmanager
async def serve_store(
    bucket: S3Bucket,
    log_settings: LogSettings = FAST_LOG,
    principal: Callable[[], str] = lambda: "tester",
    **kwargs: Any,
) -> AsyncIterator[StoreServer]:
    """Runs a store on the bucket over real S3 HTTP and real gRPC, until the block exits."""
    store = make_store(
        S3BlobStore(s3_location(bucket), part_size=MIN_PART_SIZE), log_settings, **kwargs
    )
    await store.start()
    try:
        servicer = AdapterStoreServicer(store, principal)
        async with serving(
            register(servicer),
            [SERVICE_NAME],
            write_methods=WRITE_METHODS,
            replica_methods=REPLICA_METHODS,
        ) as running:
            address = f"127.0.0.1:{running.port}"
            async with grpc.aio.insecure_channel(address) as channel:
                yield StoreServer(store, address, pb_grpc.AdapterStoreServiceStub(channel))
    finally:
        await store.close()


def push_requests(
    name: str,
    files: AdapterFiles,
    chunk_size: int = 256 * 1024,
    declare_sha256: bool = True,
    **header: Any,
) -> Iterator[pb.PushAdapterRequest]:
    """A push as adapterctl sends it: each file's sha256 declared unless told not to."""
    yield pb.PushAdapterRequest(
        header=pb.PushHeader(
            name=name,
            files=[
                pb.FileInfo(
                    name=n,
                    size=len(d),
                    sha256=hashlib.sha256(d).hexdigest() if declare_sha256 else "",
                )
                for n, d in files.items()
            ],
            **header,
        )
    )
    for file_name, data in files.items():
        for offset in range(0, len(data), chunk_size):
            chunk = pb.FileChunk(
                file_name=file_name, offset=offset, data=data[offset : offset + chunk_size]
            )
            yield pb.PushAdapterRequest(chunk=chunk)

"""Row 6, store side: bad adapters and bad names pushed over the real gRPC API.

Each push gets INVALID_ARGUMENT with a message naming the problem (or, for a gRPC
message over the server's limit, RESOURCE_EXHAUSTED from gRPC itself); once the push
has ended the bucket is byte-for-byte unchanged, with no multipart upload left, and
the server still answers SERVING.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from loraserve.adapterstore.files.push import PushResult
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.testing.adapters.files import (
    AdapterFiles,
    lora_config,
    raw_safetensors,
    tiny_adapter,
)
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.processes.services import health_status
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.store.stores import TEST_LIMITS
from loraserve.testing.waiting import eventually

pytestmark = pytest.mark.faults

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


class _Exploit:
    """Unpickling this would run code: the reason pickles are refused outright."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pickle payload ran",))


def _pickle_payload() -> bytes:
    return pickle.dumps({"lora_A": _Exploit()})


def _torch_style_zip() -> bytes:
    """The layout of a `torch.save` file: a zip whose data.pkl is a pickle."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", _pickle_payload())
    return buffer.getvalue()


def _valid_weights() -> tuple[dict[str, object], bytes]:
    weights = tiny_adapter()[WEIGHTS]
    (length,) = struct.unpack("<Q", weights[:8])
    return json.loads(weights[8 : 8 + length]), weights[8 + length :]


def _lying_offsets() -> bytes:
    """A header whose last tensor claims bytes past the end of the file."""
    header, data = _valid_weights()
    last = max(header, key=lambda k: header[k]["data_offsets"][1])  # type: ignore[index]
    begin, end = header[last]["data_offsets"]  # type: ignore[index]
    header[last] = {**header[last], "data_offsets": [begin, end + 4096]}  # type: ignore[dict-item]
    return raw_safetensors(header, data)


def _lying_length() -> bytes:
    header, data = _valid_weights()
    return raw_safetensors(header, data, length=len(json.dumps(header)) + 10**6)


@dataclass(frozen=True)
class Bad:
    id: str
    files: AdapterFiles
    message: str
    name: str = "bad"


BAD_ADAPTERS = [
    Bad("pickle-as-bin", {**tiny_adapter(), "adapter_model.bin": _pickle_payload()}, "pickle"),
    Bad("pickle-as-pth", {**tiny_adapter(), "weights.pth": _torch_style_zip()}, "pickle"),
    Bad("pickle-as-ckpt", {**tiny_adapter(), "model.ckpt": _pickle_payload()}, "pickle"),
    Bad("pickle-named-safetensors", tiny_adapter() | {WEIGHTS: _pickle_payload()}, WEIGHTS),
    Bad("torch-zip-named-safetensors", tiny_adapter() | {WEIGHTS: _torch_style_zip()}, WEIGHTS),
    Bad("pickle-named-config", tiny_adapter() | {CONFIG: _pickle_payload()}, "not valid JSON"),
    Bad(
        "truncated-safetensors",
        tiny_adapter() | {WEIGHTS: tiny_adapter()[WEIGHTS][:-100]},
        WEIGHTS,
    ),
    Bad(
        "truncated-inside-header",
        tiny_adapter() | {WEIGHTS: tiny_adapter()[WEIGHTS][:40]},
        "runs past the end",
    ),
    Bad("header-lying-offsets", tiny_adapter() | {WEIGHTS: _lying_offsets()}, WEIGHTS),
    Bad("header-lying-length", tiny_adapter() | {WEIGHTS: _lying_length()}, "runs past the end"),
    Bad("empty-safetensors", tiny_adapter() | {WEIGHTS: b""}, "too short"),
    Bad(
        "weights-of-another-rank",
        tiny_adapter() | {CONFIG: lora_config(rank=16)},
        "rank r=16",
    ),
    Bad(
        "config-not-lora",
        tiny_adapter() | {CONFIG: lora_config(peft_type="IA3")},
        "LORA",
    ),
]

BAD_NAMES = {
    "dot-dot": "..",
    "dot-dot-inside": "a..b",
    "path-traversal": "../etc",
    "slash": "team/adapter",
    "backslash": "team\\adapter",
    "nul": "adapter\0x",
    "cyrillic-homoglyph": "\u0430dapter",  # CYRILLIC SMALL LETTER A
    "rtl-override": "ad\u202eretpa",
    "fullwidth": "\uff41dapter",
    "zero-width-space": "ad\u200bapter",
    "upper-case": "Adapter",
    "empty": "",
    "leading-dash": "-adapter",
    "trailing-newline": "adapter\n",
    "space": "my adapter",
    "too-long": "a" * 64,
}


def _pb_requests(case: Bad) -> Iterator[pb.PushAdapterRequest]:
    return push_requests(case.name, case.files)


@dataclass
class StorePushes:
    """The store's pushes as the servicer calls them: running now, and ended (returned
    or raised; a refused push has aborted every upload it started by then)."""

    running: int = 0
    ended: int = 0


async def _expect_refused(
    store: RunningStore,
    pushes: StorePushes,
    requests: Iterator[pb.PushAdapterRequest],
) -> grpc.aio.AioRpcError:
    bucket = store.bucket
    before = bucket.keys()
    async with store_stub(store.address) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stream_unary(stub.PushAdapter, requests, timeout=60)
    # A refused push may still be cleaning up when its status arrives (a gRPC-level
    # refusal cancels the handler), so the bucket is read once the push has ended.
    # Anything it wrote is visible then: as an object, or as a multipart upload, where
    # a push's bytes sit until it is completed or aborted.
    await eventually(lambda: (pushes.ended, pushes.running) == (1, 0), "the push ended")
    assert bucket.keys() == before
    assert bucket.multipart_uploads() == []
    assert await health_status(store.address) == health_pb2.HealthCheckResponse.SERVING
    return caught.value


@pytest.fixture(scope="module")
async def seeded_store(module_store_server: RunningStore) -> RunningStore:
    """A store with one good adapter in it, so 'nothing written' has something to keep;
    every test here is refused, and each checks the bucket against what it held before,
    so they share it."""
    async with store_stub(module_store_server.address) as stub:
        await push(stub, "good", tiny_adapter(seed=9))
    return module_store_server


@pytest.fixture
def pushes(seeded_store: RunningStore, monkeypatch: pytest.MonkeyPatch) -> StorePushes:
    """Counts the seeded store's pushes from here on; each still runs the real push."""
    counted = StorePushes()
    real = seeded_store.store.push

    async def push(*args: Any, **kwargs: Any) -> PushResult:
        counted.running += 1
        try:
            return await real(*args, **kwargs)
        finally:
            counted.running -= 1
            counted.ended += 1

    monkeypatch.setattr(seeded_store.store, "push", push)
    return counted


@pytest.mark.parametrize("case", BAD_ADAPTERS, ids=lambda c: c.id)
async def test_bad_adapter_is_invalid_argument_and_writes_nothing(
    case: Bad,
    seeded_store: RunningStore,
    pushes: StorePushes,
    pytestconfig: pytest.Config,
) -> None:
    add_figure(pytestconfig, "bad_inputs.adapters_pushed")
    error = await _expect_refused(seeded_store, pushes, _pb_requests(case))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert case.message in (error.details() or "")


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
async def test_bad_name_push_is_invalid_argument_and_writes_nothing(
    name: str,
    seeded_store: RunningStore,
    pushes: StorePushes,
    pytestconfig: pytest.Config,
) -> None:
    add_figure(pytestconfig, "bad_inputs.names")
    error = await _expect_refused(seeded_store, pushes, push_requests(name, tiny_adapter()))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid adapter name" in (error.details() or "")


@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
async def test_bad_name_in_every_read_and_write_call_is_invalid_argument(
    name: str, seeded_store: RunningStore
) -> None:
    async with store_stub(seeded_store.address) as stub:
        calls = [
            stub.GetAdapter(pb.GetAdapterRequest(name=name)),
            stub.ListRevisions(pb.ListRevisionsRequest(name=name)),
            stub.SetCurrentRevision(pb.SetCurrentRevisionRequest(name=name, revision=1)),
            stub.DeleteAdapter(pb.DeleteAdapterRequest(name=name)),
        ]
        codes = []
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            codes.append(caught.value.code())
        with pytest.raises(grpc.aio.AioRpcError) as download:
            async for _ in stub.DownloadAdapter(pb.DownloadAdapterRequest(name=name)):
                pass
    assert set(codes) == {grpc.StatusCode.INVALID_ARGUMENT}
    assert download.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_file_declared_over_the_size_limit_is_refused_before_any_byte(
    seeded_store: RunningStore, pushes: StorePushes
) -> None:
    files = tiny_adapter()
    header = pb.PushAdapterRequest(
        header=pb.PushHeader(
            name="huge",
            files=[
                pb.FileInfo(name=CONFIG, size=len(files[CONFIG])),
                pb.FileInfo(name=WEIGHTS, size=TEST_LIMITS.max_file_size + 1),
            ],
        )
    )
    error = await _expect_refused(seeded_store, pushes, iter([header]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exceeds the limit" in (error.details() or "")


async def test_more_bytes_than_declared_is_refused(
    seeded_store: RunningStore, pushes: StorePushes
) -> None:
    files = tiny_adapter()
    requests = list(push_requests("overflow", files))
    requests.append(
        pb.PushAdapterRequest(
            chunk=pb.FileChunk(file_name=WEIGHTS, offset=len(files[WEIGHTS]), data=b"\0" * 1024)
        )
    )
    error = await _expect_refused(seeded_store, pushes, iter(requests))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than the declared" in (error.details() or "")


async def test_message_over_the_grpc_limit_is_resource_exhausted(
    seeded_store: RunningStore, pushes: StorePushes
) -> None:
    big = 17 * 1024 * 1024
    files = tiny_adapter()
    header = pb.PushAdapterRequest(
        header=pb.PushHeader(
            name="oversized",
            files=[
                pb.FileInfo(name=CONFIG, size=len(files[CONFIG])),
                pb.FileInfo(name=WEIGHTS, size=big),
            ],
        )
    )
    chunk = pb.PushAdapterRequest(
        chunk=pb.FileChunk(file_name=CONFIG, offset=0, data=files[CONFIG])
    )
    oversized = pb.PushAdapterRequest(
        chunk=pb.FileChunk(file_name=WEIGHTS, offset=0, data=b"\0" * big)
    )
    error = await _expect_refused(seeded_store, pushes, iter([header, chunk, oversized]))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

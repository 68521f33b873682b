"""A push the store refuses while the client is still sending reaches the client as the
store's status, every time.

The store answers a client-streaming push as soon as it knows it will refuse it: no
token, a reader token, a file over the size limit, a bad file mid-stream. Whether the
client was between writes or in the middle of one then is down to timing, so each case
runs many times; a single run that reports grpc's `INTERNAL: Internal error from Core`
instead of the store's status fails the test.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_NOT_ALLOWED, EXIT_USAGE
from loraserve.adapterstore.files.validation import Limits
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, Token, secure_channel
from loraserve.testing.adapters.ctl import ctl, write_adapter_dir
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import RunningStore, running_store

pytestmark = [pytest.mark.faults, pytest.mark.slow]

READER = "reader-secret"
WRITER = "writer-secret"
MiB = 1024 * 1024
LIMITS = Limits(max_file_size=2 * MiB, max_adapter_size=8 * MiB)
# The old client lost the status in about half the runs of a token refusal and in one
# run in ten to forty of a size or file refusal; a refused push takes milliseconds.
RUNS = 30

# A safetensors file whose 40-byte header is not JSON: refused once its first chunk is in.
BAD_HEADER = struct.pack("<Q", 40) + b"{this is not json" + b" " * 23


def _large(directory: Path, weights: bytes | None = None) -> Path:
    """An adapter of several 1 MiB chunks, each file under the limit."""
    write_adapter_dir(directory)
    if weights is not None:
        (directory / "adapter_model.safetensors").write_bytes(weights)
    (directory / "README.md").write_bytes(b"r" * (2 * MiB - 100))
    (directory / "tokenizer.json").write_bytes(b"t" * (2 * MiB - 100))
    return directory


def _over_limit(directory: Path, size: int) -> Path:
    write_adapter_dir(directory)
    (directory / "README.md").write_bytes(b"r" * size)
    return directory


@dataclass(frozen=True)
class Refusal:
    token: str | None
    build: Callable[[Path], Path]
    message: str
    exit_code: int


_UNAUTHENTICATED = "UNAUTHENTICATED: missing 'authorization: Bearer <token>' metadata"
_DENIED = (
    "PERMISSION_DENIED: /loraserve.adapterstore.v1.AdapterStoreService/PushAdapter"
    " needs a writer token"
)
_BAD_HEADER = (
    "adapter_model.safetensors header: not valid JSON: Expecting property"
    " name enclosed in double quotes: line 1 column 2 (char 1)"
)

REFUSALS = {
    "no-token-small": Refusal(None, write_adapter_dir, _UNAUTHENTICATED, EXIT_NOT_ALLOWED),
    "no-token-large": Refusal(None, _large, _UNAUTHENTICATED, EXIT_NOT_ALLOWED),
    "reader-token-small": Refusal(READER, write_adapter_dir, _DENIED, EXIT_NOT_ALLOWED),
    "reader-token-large": Refusal(READER, _large, _DENIED, EXIT_NOT_ALLOWED),
    "over-limit-small": Refusal(
        WRITER,
        lambda d: _over_limit(d, LIMITS.max_file_size + 1),
        "INVALID_ARGUMENT: file 'README.md': size 2097153 exceeds the limit of 2097152 bytes",
        EXIT_FAILED,
    ),
    "over-limit-large": Refusal(
        WRITER,
        lambda d: _over_limit(d, 7 * MiB),
        "INVALID_ARGUMENT: file 'README.md': size 7340032 exceeds the limit of 2097152 bytes",
        EXIT_FAILED,
    ),
}

# Bad files as the store receives them from any client: adapterctl itself refuses them
# before sending (`adapter_dir`), so the store's mid-stream refusal is driven directly.
BAD_FILES = {
    "bad-file-small": {**tiny_adapter(), "adapter_model.safetensors": BAD_HEADER + b"\0" * 64},
    "bad-file-large": {
        **tiny_adapter(),
        "adapter_model.safetensors": BAD_HEADER + b"\0" * (2 * MiB - 200),
        "README.md": b"r" * (2 * MiB - 100),
        "tokenizer.json": b"t" * (2 * MiB - 100),
    },
}


@pytest.fixture(scope="module")
async def guarded_store(module_s3_bucket: S3Bucket) -> AsyncIterator[RunningStore]:
    """A store with tokens and size limits; every push here is refused, so they share it."""
    security = ServerSecurity(
        reader_tokens=(Token("inference", READER),), writer_tokens=(Token("ci", WRITER),)
    )
    async with running_store(module_s3_bucket, security=security, limits=LIMITS) as store:
        yield store


@pytest.mark.parametrize("case", list(REFUSALS))
async def test_refused_push_reports_the_stores_status_and_exit_code_every_time(
    case: str, guarded_store: RunningStore, tmp_path: Path
) -> None:
    refusal = REFUSALS[case]
    directory = refusal.build(tmp_path / case)
    env = {"ADAPTERSTORE_ADDR": guarded_store.address}
    if refusal.token is not None:
        env["ADAPTERCTL_TOKEN"] = refusal.token
    outcomes = []
    for _ in range(RUNS):
        result = await ctl("push", "refused", str(directory), env=env)
        outcomes.append((result.code, result.err.strip(), result.out))
    assert outcomes == [(refusal.exit_code, f"adapterctl: error: {refusal.message}", "")] * RUNS


async def test_refused_push_through_the_client_library_reports_the_stores_status(
    guarded_store: RunningStore,
) -> None:
    files = {**tiny_adapter(), "README.md": b"r" * (2 * MiB - 100)}
    codes = []
    async with secure_channel(guarded_store.address, ClientSecurity()) as channel:
        stub = pb_grpc.AdapterStoreServiceStub(channel)
        for _ in range(RUNS):
            try:
                await push(stub, "refused", files)
            except grpc.aio.AioRpcError as exc:
                codes.append((exc.code(), exc.details()))
    assert (
        codes
        == [(grpc.StatusCode.UNAUTHENTICATED, "missing 'authorization: Bearer <token>' metadata")]
        * RUNS
    )


@pytest.mark.parametrize("case", list(BAD_FILES))
async def test_bad_file_refused_mid_stream_reaches_the_client_as_invalid_argument_every_time(
    case: str, guarded_store: RunningStore
) -> None:
    codes = []
    security = ClientSecurity(token=WRITER)
    async with secure_channel(guarded_store.address, security) as channel:
        stub = pb_grpc.AdapterStoreServiceStub(channel)
        for _ in range(RUNS):
            try:
                await push(stub, "refused", BAD_FILES[case])
            except grpc.aio.AioRpcError as exc:
                codes.append((exc.code(), exc.details()))
    assert codes == [(grpc.StatusCode.INVALID_ARGUMENT, _BAD_HEADER)] * RUNS


async def test_adapterctl_refuses_a_bad_file_before_sending_it(
    guarded_store: RunningStore, tmp_path: Path
) -> None:
    directory = write_adapter_dir(tmp_path / "bad")
    (directory / "adapter_model.safetensors").write_bytes(BAD_HEADER + b"\0" * 64)
    env = {"ADAPTERSTORE_ADDR": guarded_store.address, "ADAPTERCTL_TOKEN": WRITER}
    result = await ctl("push", "refused", str(directory), env=env)
    assert (result.code, result.err.strip()) == (
        EXIT_USAGE,
        f"adapterctl: error: {directory}: the store would refuse it: {_BAD_HEADER}",
    )

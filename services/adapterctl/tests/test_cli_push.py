"""The push stream adapterctl sends, checked message by message, its progress bar, and
the idempotency keys `push --watch` sends."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Generator
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.adapterctl.adapter_dir import hash_files, list_adapter_dir
from loraserve.adapterctl.commands.write import StorePublisher
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.progress import Progress
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.push import CHUNK_SIZE, upload
from loraserve.common.rpc.security import ClientSecurity
from loraserve.testing.adapters.ctl import TtyBuffer, write_adapter_dir

README_SIZE = 2 * CHUNK_SIZE + 123


class RecordingCall:
    """Stands in for a client-streaming call: records writes, answers or fails at the end."""

    def __init__(self, accept: int | None = None, error: grpc.aio.AioRpcError | None = None):
        self.requests: list[pb.PushAdapterRequest] = []
        self.accept = accept  # writes taken before the "server" ends the call
        self.error = error
        self.cancelled = False
        self.done_writing_called = False

    async def write(self, request: pb.PushAdapterRequest) -> None:
        if self.accept is not None and len(self.requests) >= self.accept:
            raise asyncio.InvalidStateError("RPC already finished")
        self.requests.append(request)

    async def done_writing(self) -> None:
        self.done_writing_called = True

    def done(self) -> bool:
        return False

    def add_done_callback(self, callback: Any) -> None:
        pass

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def __await__(self) -> Generator[Any, None, pb.PushAdapterResponse]:
        if self.error is not None:
            raise self.error
        yield from asyncio.sleep(0).__await__()
        return pb.PushAdapterResponse(revision=pb.Revision(adapter_name="alpha", revision=1))


class Stub:
    def __init__(self, call: RecordingCall) -> None:
        self.call = call

    def PushAdapter(self, timeout: float | None = None) -> RecordingCall:
        return self.call


def _adapter_with_big_readme(tmp_path: Path) -> Path:
    adapter = write_adapter_dir(tmp_path)
    (adapter / "README.md").write_bytes(bytes(range(256)) * (README_SIZE // 256) + b"x" * 123)
    return adapter


async def test_header_comes_first_with_sizes_and_sha256(tmp_path: Path) -> None:
    files = hash_files(list_adapter_dir(_adapter_with_big_readme(tmp_path)))
    call = RecordingCall()
    await upload(
        Stub(call),
        "alpha",
        files,
        no_promote=True,
        description="d",
        timeout_s=None,
        idempotency_key="k",
    )
    header = call.requests[0].header
    assert (header.name, header.no_promote, header.description) == ("alpha", True, "d")
    assert [(f.name, f.size, f.sha256) for f in header.files] == [
        (f.name, f.size, f.sha256) for f in files.files
    ]
    assert call.done_writing_called


async def test_files_stream_in_header_order_in_chunks_of_at_most_1_mib(tmp_path: Path) -> None:
    adapter = _adapter_with_big_readme(tmp_path)
    files = hash_files(list_adapter_dir(adapter))
    call = RecordingCall()
    await upload(
        Stub(call),
        "alpha",
        files,
        no_promote=False,
        description="",
        timeout_s=None,
        idempotency_key="k",
    )
    chunks = [r.chunk for r in call.requests[1:]]
    assert all(len(c.data) <= CHUNK_SIZE for c in chunks)
    assert [c.file_name for c in chunks] == sorted(
        (c.file_name for c in chunks), key=[f.name for f in files.files].index
    )
    for local in files.files:
        own = [c for c in chunks if c.file_name == local.name]
        assert [c.offset for c in own] == [i * CHUNK_SIZE for i in range(len(own))]
        data = b"".join(c.data for c in own)
        assert hashlib.sha256(data).hexdigest() == local.sha256
    assert len([c for c in chunks if c.file_name == "README.md"]) == 3


async def test_rejection_mid_stream_raises_the_servers_status(tmp_path: Path) -> None:
    files = hash_files(list_adapter_dir(write_adapter_dir(tmp_path)))
    status = grpc.aio.AioRpcError(
        grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), "bad header"
    )
    call = RecordingCall(accept=1, error=status)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await upload(
            Stub(call),
            "alpha",
            files,
            no_promote=False,
            description="",
            timeout_s=None,
            idempotency_key="k",
        )
    assert caught.value.details() == "bad header"
    assert len(call.requests) == 1


def test_progress_bar_draws_on_a_terminal_and_erases_itself() -> None:
    stream = TtyBuffer()
    progress = Progress(stream, "uploading alpha", 100, enabled=True)
    progress.advance(50)
    progress.finish()
    text = stream.getvalue()
    assert "uploading alpha [###############...............]  50%" in text
    assert text.endswith("\r\x1b[K")


def test_disabled_progress_writes_nothing() -> None:
    stream = TtyBuffer()
    progress = Progress(stream, "uploading alpha", 100, enabled=False)
    progress.advance(100)
    progress.finish()
    assert stream.getvalue() == ""


class Calls:
    """A stub whose pushes are the given calls, in order."""

    def __init__(self, *calls: RecordingCall) -> None:
        self.calls = list(calls)
        self.used: list[RecordingCall] = []

    def PushAdapter(self, timeout: float | None = None) -> RecordingCall:
        call = self.calls.pop(0)
        self.used.append(call)
        return call

    def keys(self) -> list[str]:
        return [call.requests[0].header.idempotency_key for call in self.used]


def _unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "store down"
    )


def _publisher(stub: Calls) -> StorePublisher:
    settings = CtlSettings(
        "store:1", "inference:1", ClientSecurity(), ClientSecurity(), None, False
    )
    return StorePublisher(stub, "alpha", settings, no_promote=False, description="")


async def test_watch_publisher_reuses_its_key_while_retrying_the_same_content(
    tmp_path: Path,
) -> None:
    files = hash_files(list_adapter_dir(write_adapter_dir(tmp_path)))
    stub = Calls(RecordingCall(error=_unavailable()), RecordingCall())
    publisher = _publisher(stub)
    with pytest.raises(grpc.aio.AioRpcError):
        await publisher.publish(files)
    await publisher.publish(files)
    first, retried = stub.keys()
    assert first
    assert retried == first


async def test_watch_publisher_takes_a_new_key_for_new_content_and_after_success(
    tmp_path: Path,
) -> None:
    files = hash_files(list_adapter_dir(write_adapter_dir(tmp_path / "a")))
    other = hash_files(list_adapter_dir(write_adapter_dir(tmp_path / "b", seed=1)))
    stub = Calls(RecordingCall(error=_unavailable()), RecordingCall(), RecordingCall())
    publisher = _publisher(stub)
    with pytest.raises(grpc.aio.AioRpcError):
        await publisher.publish(files)
    await publisher.publish(other)
    await publisher.publish(other)
    keys = stub.keys()
    assert len(set(keys)) == 3

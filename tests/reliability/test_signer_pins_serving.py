"""Signer pins, replica side (issue 54 item 3): a replica applies its own
`--trusted-signers` pins before it routes a revision, whatever the store let through
(its policy is off here). Real parts: moto over HTTP, the store's gRPC server, the
inference app on the session's vLLM engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.common.revisions.manifest import RevisionKey
from loraserve.common.trust.signing import sign_revision
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.adapters.pushes import hashed
from loraserve.testing.adapters.signers import write_key_pair
from loraserve.testing.inference.app import adapter_files, inference_app
from loraserve.testing.inference.stack import replica_answer
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

REPLICA = "pinned-replica"


async def test_a_replica_refuses_a_revision_its_signer_may_not_sign(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> None:
    key = write_key_pair(tmp_path / "keys", "ci")
    files = adapter_files(tiny_adapter(seed=1))
    signature = sign_revision(RevisionKey("team-b-x", 1), hashed(files), key.private)
    pinned = f"ci={key.public};prefix=team-a-"
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        replica_id=REPLICA,
        extra=("--signature-policy", "require", "--trusted-signers", pinned),
    ) as inference:
        async with store_stub(store_server.address) as stub:
            await push(stub, "team-b-x", files, signature=signature)
        report = await replica_answer(store_server.address, REPLICA, "team-b-x", 1)
        assert report.type == store_pb.REPORT_TYPE_NACK
        assert report.last_error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        assert "may sign only adapters whose names start with prefix team-a-" in (
            report.last_error.message
        )
        assert "team-b-x@1" not in inference.add_calls

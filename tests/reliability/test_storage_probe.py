"""A store refuses to start on S3 that ignores `If-None-Match: *`.

The unsuitable backend is moto behind the fault proxy, which strips the header
from the probe's PUTs, as a backend without conditional writes would ignore it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loraserve.adapterstore.blobs.s3blobs import S3BlobStore
from loraserve.adapterstore.blobs.storageprobe import PROBE_KEY, PROBE_PREFIX, check_conditional_put
from loraserve.testing.processes.services import store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.stores import s3_location

pytestmark = pytest.mark.faults


async def test_store_on_s3_ignoring_if_none_match_exits_1_saying_so(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy, tmp_path: Path
) -> None:
    fault_proxy.add(Fault.STRIP_IF_NONE_MATCH, "PUT", PROBE_PREFIX)
    async with store_process(
        s3_bucket, tmp_path / "store.log", endpoint_url=fault_proxy.endpoint_url, wait_serving=False
    ) as store:
        code = await store.wait()
    assert code == 1
    assert "object storage ignores If-None-Match: * on PUT" in store.log_text()
    stored = s3_bucket.keys()
    assert [k for k in stored if not k.startswith(PROBE_PREFIX)] == []


async def test_probe_passes_on_moto_in_two_requests_then_one_leaving_one_object(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy
) -> None:
    blobs = S3BlobStore(s3_location(replace(s3_bucket, endpoint_url=fault_proxy.endpoint_url)))
    await check_conditional_put(blobs)
    first = len(fault_proxy.requests)
    await check_conditional_put(blobs)
    assert (first, len(fault_proxy.requests) - first) == (2, 1)
    assert s3_bucket.keys() == [PROBE_KEY]

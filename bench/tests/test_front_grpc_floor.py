"""bench/front/grpc_floor.py compares like with like: every server variant, whatever it is built
on, streams the same valid gRPC messages to the generated grpc.aio stub and ends the
call OK (no engine: each variant is its own server process on 127.0.0.1)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import grpc
import pytest

from bench.front.grpc_floor import Run, build_parser, served, table_of
from bench.front.grpc_floor_servers import VARIANTS, Shape
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

MESSAGES = 5
# bridge-rcts is a paced variant only.
CASES = [
    (variant, mode)
    for mode in ("paced", "closed")
    for variant in sorted(VARIANTS)
    if (variant, mode) != ("bridge-rcts", "closed")
]


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "mode"), CASES)
async def test_every_variant_streams_the_servicers_messages(variant: str, mode: str) -> None:
    args = build_parser().parse_args(["--messages", str(MESSAGES), "--step-ms", "2"])
    expected = Shape(MESSAGES, paced=False, step_s=0.0)
    with served(variant, mode, args) as (address, _):
        async with grpc.aio.insecure_channel(address) as channel:
            call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=30)
            got = [response async for response in call]
            assert await call.code() == grpc.StatusCode.OK
    assert len(got) == MESSAGES
    for i, response in enumerate(got):
        want = expected.message(i)
        # Request ids are counted per server process; the rest is the same for everyone.
        want.request_id = response.request_id
        assert response == want
    assert got[0].request_id.startswith("req-")


def test_table_gives_ratios_to_the_named_reference(tmp_path: Path) -> None:
    runs = [
        Run("aio-asyncio", "paced", 0, messages=1000, server_cpu_s=0.2),
        Run("aio", "paced", 0, messages=1000, server_cpu_s=0.1),
    ]
    out = tmp_path / "floor.json"
    out.write_text(
        json.dumps({"args": {"variants": "aio-asyncio,aio"}, "runs": [asdict(r) for r in runs]})
    )
    rows = table_of(out, "aio").splitlines()
    assert "x aio (range)" in rows[0]
    assert rows[2].startswith("| paced | aio-asyncio | 200 (200-200) | 2.00 (2.00-2.00) |")
    assert rows[3].startswith("| paced | aio | 100 (100-100) | 1.00 (1.00-1.00) |")


def test_table_names_a_reference_the_file_lacks(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    run = asdict(Run("aio", "paced", 0, messages=10, server_cpu_s=0.1))
    out.write_text(json.dumps({"args": {"variants": "aio"}, "runs": [run]}))
    with pytest.raises(SystemExit, match="no runs of 'sync'"):
        table_of(out, "sync")

"""Starts a real server, calls it from a chosen address and prints what it answered, as
one JSON object: `python -m loraserve.testing.protected_calls SERVER --client HOST
[--token TOKEN] -- SERVER_FLAGS...`, run inside `loraserve.testing.netns`'s namespace,
where HOST 192.0.2.1 is a non-loopback client of this host and 127.0.0.1 a loopback one.

SERVER is `store` (`adapterstore serve` in a child process, over moto's S3 in this one),
`inference` (the inference service's gRPC front, as `inference serve` starts it, on an
in-memory engine) or `openai` (its OpenAI HTTP front on the same engine). Each listens on
0.0.0.0; SERVER_FLAGS are that server's own command-line flags. With
LORASERVE_TEST_FORWARDED_FOR in the environment, the HTTP call claims that address in
X-Forwarded-For.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import socket
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import boto3
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from moto.moto_server.threaded_moto_server import ThreadedMotoServer

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.inference.adapters import LLAMA_TARGET_MODULES, AdapterRegistry, CompatibilityChecker
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.openai import create_openai_app, start_http_server
from loraserve.inference.serving import Admission, Generator, Runtime, RuntimeRef
from loraserve.inference.settings import parse_settings
from loraserve.inference.transport import start_grpc_front
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.fakes.engine import CacheDirectory, FakeEngine
from loraserve.testing.waiting import eventually

MODEL = "fake-llama"
BUCKET = "protected-mode"
# What the servers say at start-up about who may call them.
_EXPOSURE = re.compile(r"server\.(protected_mode|insecure|auth_disabled)")
_READY_S = 60.0


async def _answer(call: Awaitable[Any]) -> dict[str, str]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return {"code": exc.code().name, "details": exc.details() or ""}
    return {"code": "OK", "details": ""}


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


async def _health(address: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


async def _serving(address: str) -> bool:
    return await _health(address) == "SERVING"


def _free_port() -> int:
    # Nothing else runs in the namespace, so nobody takes the port before the server.
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def _s3_bucket() -> tuple[ThreadedMotoServer, str]:
    """moto's S3 on this namespace's loopback with the store's bucket; its endpoint URL."""
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s3.start()
    host, port = s3.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=BUCKET)
    return s3, endpoint


async def _store(client: str, token: str | None, flags: list[str]) -> dict[str, Any]:
    s3, endpoint = _s3_bucket()
    port = _free_port()
    argv = [
        *("serve", f"--listen=0.0.0.0:{port}", f"--s3-endpoint={endpoint}", f"--bucket={BUCKET}"),
        *("--region=us-east-1", "--access-key-id=testing", "--secret-access-key=testing"),
        *flags,
    ]
    with tempfile.TemporaryFile("w+") as log:
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loraserve.adapterstore", *argv, stderr=log
        )
        try:
            local = f"127.0.0.1:{port}"
            await eventually(lambda: _serving(local), "the store serves", _READY_S)
            address = f"{client}:{port}"
            async with grpc.aio.insecure_channel(address) as channel:
                listing = store_grpc.AdapterStoreServiceStub(channel).ListAdapters(
                    store_pb.ListAdaptersRequest(), metadata=_metadata(token), timeout=10
                )
                result = {"call": await _answer(listing), "health": await _health(address)}
        finally:
            server.terminate()
            await server.wait()
            s3.stop()
        log.seek(0)
        return {**result, "startup": sorted(set(_EXPOSURE.findall(log.read())))}


def _runtime_ref(cache_dir: Path) -> RuntimeRef:
    """The runtime of a started inference service, on an in-memory engine."""
    engine = FakeEngine()
    compat = CompatibilityChecker(
        max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name=MODEL
    )
    registry = AdapterRegistry(engine, CacheDirectory(cache_dir), compat)
    admission = Admission(4)
    generator = Generator(engine, registry, admission, InferenceMetrics())
    return RuntimeRef(Runtime(engine, registry, generator, admission, replica_id="r"))


def _inference_settings(flags: list[str]) -> Any:
    argv = ["serve", f"--model={MODEL}", "--store=127.0.0.1:1", "--listen=0.0.0.0:0", *flags]
    return parse_settings(argv, {}, "replica")


async def _inference(client: str, token: str | None, flags: list[str]) -> dict[str, Any]:
    settings = _inference_settings(flags)
    with tempfile.TemporaryDirectory() as cache_dir:
        front = await start_grpc_front(settings, _runtime_ref(Path(cache_dir)))
        try:
            async with grpc.aio.insecure_channel(f"{client}:{front.port}") as channel:
                listing = pb_grpc.InferenceServiceStub(channel).ListAdapters(
                    pb.ListAdaptersRequest(), metadata=_metadata(token), timeout=10
                )
                return {"call": await _answer(listing)}
        finally:
            await front.stop(None)


def _get(url: str, token: str | None) -> dict[str, Any]:
    headers = dict(_metadata(token))
    if forwarded_for := os.environ.get("LORASERVE_TEST_FORWARDED_FOR"):
        headers["x-forwarded-for"] = forwarded_for
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return {"status": response.status, "body": json.loads(response.read())}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": json.loads(exc.read())}


async def _openai(client: str, token: str | None, flags: list[str]) -> dict[str, Any]:
    settings = _inference_settings(["--openai-listen=0.0.0.0:0", *flags])
    with tempfile.TemporaryDirectory() as cache_dir:
        app = create_openai_app(
            _runtime_ref(Path(cache_dir)),
            model_names=[MODEL],
            security=settings.security,
            is_ready=lambda: True,
        )
        server = await start_http_server(
            app, address=settings.openai_listen, security=settings.security
        )
        try:
            url = f"http://{client}:{server.port}/v1/models"
            return {"models": await asyncio.to_thread(_get, url, token)}
        finally:
            await server.stop(None)


SERVERS = {"store": _store, "inference": _inference, "openai": _openai}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("server", choices=sorted(SERVERS))
    parser.add_argument("--client", required=True, help="address to call the server at")
    parser.add_argument("--token", help="bearer token to call with")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, flags = parser.parse_args(argv[:split]), argv[split + 1 :]
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    result = asyncio.run(SERVERS[args.server](args.client, args.token, flags))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

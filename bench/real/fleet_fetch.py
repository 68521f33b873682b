"""`python -m bench.real.fleet_fetch MODE ...`: one member of a fleet cold start (benchmark
15), in its own process like a replica. It sets everything up, writes `ready` on
stdout, waits for a line on stdin, fetches every adapter, and writes one JSON line:
{"bytes": B, "ended": time.monotonic() when the last byte was written}.

    cache  --store ADDR --adapter NAME@REV ...   the inference service's AdapterCache
                                                 (from the store: stream, sha256, rename)
    boto3  --s3 URL --bucket B --key KEY ...     one streamed get_object per object
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.rig import procs
from bench.store.transfers import STREAM_CHUNK
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.cache import AdapterCache


def _ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()


async def _caches(store: str, adapters: list[str], root: Path) -> int:
    client = StoreClient.connect(
        StoreClientSettings(address=store, security=ClientSecurity(), replica_id=root.name)
    )
    try:
        cache = AdapterCache(root, client)
        await cache.prepare()
        await asyncio.to_thread(_ready)
        total = 0
        for ref in adapters:
            name, _, revision = ref.partition("@")
            cached = await cache.fetch(name, int(revision))
            total += sum(f.size for f in cached.manifest.files)
        return total
    finally:
        await client.close()


def _boto3(endpoint: str, bucket: str, keys: list[str], root: Path) -> int:
    s3 = procs.s3_client(endpoint)
    _ready()
    total = 0
    for i, key in enumerate(keys):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        with (root / str(i)).open("wb") as out:
            for chunk in body.iter_chunks(STREAM_CHUNK):
                total += out.write(chunk)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.real.fleet_fetch")
    parser.add_argument("mode", choices=("cache", "boto3"))
    parser.add_argument("--store", default="")
    parser.add_argument("--adapter", action="append", default=[])
    parser.add_argument("--s3", default="")
    parser.add_argument("--bucket", default="")
    parser.add_argument("--key", action="append", default=[])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-fetch-"))
    try:
        if args.mode == "cache":
            total = asyncio.run(_caches(args.store, args.adapter, root))
        else:
            total = _boto3(args.s3, args.bucket, args.key, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    sys.stdout.write(json.dumps({"bytes": total, "ended": time.monotonic()}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

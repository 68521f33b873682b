"""The bare path's S3 transfers (bench.swap.arms), in a process of their own with its
own boto3 client, as the store's and adapterctl's run in theirs: in the benchmark's
process they would share one interpreter with the probes, the background streams and
the span receiver."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

_client: Any = None


def _open(endpoint: str) -> None:
    from bench.rig import procs

    global _client
    _client = procs.s3_client(endpoint)


def _warm(bucket: str) -> None:
    import bench.store.transfers  # noqa: F401  (the imports of the first transfer)

    _client.list_objects_v2(Bucket=bucket, MaxKeys=1)


def _upload(bucket: str, directory: Path, prefix: str) -> None:
    from bench.store.transfers import boto_upload

    boto_upload(_client, bucket, directory, prefix)


def _get(bucket: str, prefix: str, names: list[str], target: Path) -> None:
    from bench.store.transfers import boto_get

    boto_get(_client, bucket, prefix, names, target)


class BareS3:
    """boto3 `upload_file` and `get_object` of an adapter's files, run in one worker
    process started (spawned, not forked from a process with threads) and warmed up
    before the first swap."""

    def __init__(self, endpoint: str, bucket: str) -> None:
        self.bucket = bucket
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_open,
            initargs=(endpoint,),
        )

    def warm(self) -> None:
        """Imports, the client and a first request, outside any timed swap."""
        self._pool.submit(_warm, self.bucket).result()

    def upload(self, directory: Path, prefix: str) -> None:
        self._pool.submit(_upload, self.bucket, directory, prefix).result()

    def get(self, prefix: str, names: list[str], target: Path) -> None:
        self._pool.submit(_get, self.bucket, prefix, names, target).result()

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)

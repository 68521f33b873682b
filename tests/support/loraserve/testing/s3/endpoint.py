"""An S3 endpoint over real HTTP (moto's server) on 127.0.0.1, and a fresh bucket per test."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import BaseWSGIServer, make_server

REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"  # moto accepts any credentials

_bucket_ids = itertools.count(1)


@dataclass(frozen=True)
class S3Bucket:
    """Where a test's bucket lives and how to reach it."""

    endpoint_url: str
    bucket: str
    region: str = REGION
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def keys(self) -> list[str]:
        """Every key in the bucket, sorted."""
        paginator = self.client().get_paginator("list_objects_v2")
        return sorted(
            obj["Key"]
            for page in paginator.paginate(Bucket=self.bucket)
            for obj in page.get("Contents", [])
        )

    def multipart_uploads(self) -> list[str]:
        """The key of every multipart upload started and neither completed nor aborted,
        sorted: bytes the bucket holds that no listing of its keys shows."""
        paginator = self.client().get_paginator("list_multipart_uploads")
        return sorted(
            upload["Key"]
            for page in paginator.paginate(Bucket=self.bucket)
            for upload in page.get("Uploads", [])
        )


def _new_bucket(endpoint_url: str) -> S3Bucket:
    bucket = S3Bucket(endpoint_url, f"loraserve-test-{next(_bucket_ids)}")
    bucket.client().create_bucket(Bucket=bucket.bucket)
    return bucket


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A threaded moto S3 server in a child process (see s3process); yields its
    endpoint URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "loraserve.testing.s3.process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    endpoint = process.stdout.readline().strip()
    if not endpoint:
        process.kill()
        pytest.fail(f"the S3 server exited with code {process.wait()} before serving")
    try:
        yield endpoint
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def serial_s3_server() -> Iterator[str]:
    """A single-threaded moto S3 server, for tests that race conditional writes:
    moto checks preconditions without a lock, so only serial request handling
    makes `If-None-Match: *` a true compare-and-set."""
    server: BaseWSGIServer = make_server(
        "127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=False
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}"
    server.shutdown()
    thread.join()


@pytest.fixture
def s3_bucket(s3_server: str) -> S3Bucket:
    """A fresh, empty bucket on the threaded S3 server."""
    return _new_bucket(s3_server)


@pytest.fixture(scope="module")
def module_s3_bucket(s3_server: str) -> S3Bucket:
    """A fresh, empty bucket shared by one module's tests, on the threaded S3 server:
    for tests that are refused or only read, or that check just what they changed."""
    return _new_bucket(s3_server)


@pytest.fixture
def serial_s3_bucket(serial_s3_server: str) -> S3Bucket:
    """A fresh, empty bucket on the single-threaded S3 server."""
    return _new_bucket(serial_s3_server)

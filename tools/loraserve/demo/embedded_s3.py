"""An S3 endpoint inside the run command's process, for a machine without object storage.

It is moto's S3 server over real HTTP on 127.0.0.1: the adapter store talks to it with
boto3 exactly as it would to MinIO or AWS. Its contents live in memory and are gone
when the run command stops; that is what a demo wants, and why `--s3-endpoint` exists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# moto accepts any credentials; boto3 needs some to sign requests.
ACCESS_KEY_ID = "loraserve-demo"
SECRET_ACCESS_KEY = "loraserve-demo-secret"
REGION = "us-east-1"


@dataclass(frozen=True)
class EmbeddedEndpoint:
    url: str
    bucket: str


class EmbeddedS3:
    """Start with `start(bucket)`, stop with `stop()`; blocking, so call them in a thread."""

    def __init__(self) -> None:
        self._server: Any = None

    def start(self, bucket: str) -> EmbeddedEndpoint:
        import boto3
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self._server = server
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        client = boto3.client(
            "s3",
            endpoint_url=url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=SECRET_ACCESS_KEY,
        )
        client.create_bucket(Bucket=bucket)
        log.info("run.s3_embedded url=%s bucket=%s", url, bucket)
        return EmbeddedEndpoint(url=url, bucket=bucket)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

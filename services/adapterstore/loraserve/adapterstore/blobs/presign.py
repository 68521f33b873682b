"""Presigned GET URLs of blobs, so that replicas read object storage themselves.

A presigned URL is a bearer credential until it expires: nothing in the store logs
one, and botocore's own debug line that prints each signature it computes is
dropped (`_NoSignatures`), since at `--log-level DEBUG` it would print the one
part of a URL that makes it usable. Signing is local: it sends no request.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from loraserve.adapterstore.blobs.s3blobs import S3Location, make_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# SigV4 allows presigned URLs valid for up to seven days; the store keeps them short.
MAX_URL_TTL_S = 3600


class BlobSigner(Protocol):
    """Makes a URL that lets its holder GET one object until it expires."""

    def presign_get(self, key: str, expires_s: int) -> str:
        """A presigned GET URL of the store key `key`, valid for `expires_s` seconds."""
        ...


class _NoSignatures(logging.Filter):
    """Drops botocore's `Signature:` debug records (the signature of every request
    it signs, presigned URLs included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Signature:")


_SIGNATURE_FILTER = _NoSignatures()


class S3Presigner:
    """Presigns with the store's own credentials, for the endpoint replicas reach
    (`endpoint_url`; None: the store's own)."""

    def __init__(self, location: S3Location, endpoint_url: str | None = None) -> None:
        logging.getLogger("botocore.auth").addFilter(_SIGNATURE_FILTER)
        prefix = location.prefix.strip("/")
        self._prefix = f"{prefix}/" if prefix else ""
        self._bucket = location.bucket
        if endpoint_url:
            location = replace(location, endpoint_url=endpoint_url)
        # SigV4: botocore presigns with SigV2 by default, which AWS refuses in every
        # region opened since 2014 and will retire everywhere.
        self._client: S3Client = make_client(location, signature_version="s3v4")

    def presign_get(self, key: str, expires_s: int) -> str:
        if not 1 <= expires_s <= MAX_URL_TTL_S:
            raise ValueError(f"expires_s must be 1 to {MAX_URL_TTL_S}, got {expires_s}")
        return self._client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self._bucket, "Key": self._prefix + key},
            ExpiresIn=expires_s,
        )

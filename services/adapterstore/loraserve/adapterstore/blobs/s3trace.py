"""Spans of the store's object storage requests, one per request, named by its kind
(`loraserve.store.s3.put_object`, `....upload_part`, ...), with OpenTelemetry's AWS
SDK attributes (`rpc.system` "aws-api", `rpc.service` "S3", `rpc.method`,
`aws.s3.*`) and the bytes the request moved. Only within a traced request (a push's
uploads, its commit): the log poller's reads make no traces of their own."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from loraserve.adapterstore.blobs.blobstore import BlobNotFound
from loraserve.common.tracing import child_span, tracer

_TRACER = tracer(__name__)
# The S3 operation each kind of request is, where the kind is not its boto3 name;
# None: no single operation (reading a body is part of its GET, a managed copy may
# be one CopyObject or a multipart copy).
_OPERATIONS: Mapping[str, str | None] = {
    "put_if_absent": "PutObject",
    "read": None,
    "copy": None,
}


@contextmanager
def s3_span(what: str, bucket: str, request: Mapping[str, Any]) -> Iterator[Span]:
    """A span for one request of kind `what` with boto3 arguments `request`. A
    missing object is an answer ("loraserve.s3.found" false), not a failure."""
    with child_span(
        _TRACER, f"loraserve.store.s3.{what}", SpanKind.CLIENT, record_errors=False
    ) as span:
        if span.is_recording():
            span.set_attributes(_attributes(what, bucket, request))
        try:
            yield span
        except BlobNotFound:
            span.set_attribute("loraserve.s3.found", False)
            raise
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def count_bytes(span: Span, result: object) -> None:
    """Notes the bytes a read returned."""
    if span.is_recording() and isinstance(result, bytes | bytearray):
        span.set_attribute("loraserve.bytes", len(result))


def _attributes(what: str, bucket: str, request: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "rpc.system": "aws-api",
        "rpc.service": "S3",
        "aws.s3.bucket": bucket,
        "loraserve.s3.op": what,
    }
    operation = _OPERATIONS.get(what, "".join(word.title() for word in what.split("_")))
    if operation is not None:
        attributes["rpc.method"] = operation
    if isinstance(key := request.get("Key"), str):
        attributes["aws.s3.key"] = key
    if isinstance(part := request.get("PartNumber"), int):
        attributes["aws.s3.part_number"] = part
    if isinstance(body := request.get("Body"), bytes | bytearray):
        attributes["loraserve.bytes"] = len(body)
    return attributes

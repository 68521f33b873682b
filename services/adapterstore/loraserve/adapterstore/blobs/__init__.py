"""Object storage: the BlobStore seam the store's logic writes and reads through, its
S3 implementation (streamed multipart uploads, the start-up sweep, presigned GETs) and
the start-up probe that storage honours conditional puts."""

from loraserve.adapterstore.blobs.blobstore import (
    BlobNotFound,
    BlobStore,
    BlobUpload,
    ReceivedBlob,
    StoredObject,
    blob_key,
)
from loraserve.adapterstore.blobs.presign import MAX_URL_TTL_S, BlobSigner, S3Presigner
from loraserve.adapterstore.blobs.s3blobs import (
    DEFAULT_PART_SIZE,
    DEFAULT_PARTS_IN_FLIGHT,
    MIN_PART_SIZE,
    S3BlobStore,
    S3Location,
)
from loraserve.adapterstore.blobs.storageprobe import check_conditional_put

__all__ = [
    "DEFAULT_PARTS_IN_FLIGHT",
    "DEFAULT_PART_SIZE",
    "MAX_URL_TTL_S",
    "MIN_PART_SIZE",
    "BlobNotFound",
    "BlobSigner",
    "BlobStore",
    "BlobUpload",
    "ReceivedBlob",
    "S3BlobStore",
    "S3Location",
    "S3Presigner",
    "StoredObject",
    "blob_key",
    "check_conditional_put",
]

"""Where a revision's files can be read: presigned GET URLs of their blobs.

The store decides who may read (the call needs a reader token or better, like every
read) and hands out URLs that expire after `ttl_s`; the bytes then go from object
storage to the replica without passing through the store. A revision's blobs are
immutable and content-addressed, so a URL always yields the bytes the manifest's
SHA-256 names (the reader checks them anyway). No URL is ever logged.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from loraserve.adapterstore.blobs import BlobSigner, blob_key
from loraserve.adapterstore.catalog import Adapter, now
from loraserve.common.errors import Unimplemented
from loraserve.common.revisions.manifest import Revision
from loraserve.common.revisions.presigned import FileUrl, RevisionUrls


class RevisionLookup(Protocol):
    """Finds a revision as any read does (`AdapterStore.get`)."""

    async def get(self, name: str, revision: int = 0) -> tuple[Adapter, Revision]: ...


class DownloadUrls:
    """Signs URLs of revisions' files; with no signer (or `ttl_s` 0), Unimplemented,
    which sends replicas to the DownloadAdapter stream."""

    def __init__(self, store: RevisionLookup, signer: BlobSigner | None, ttl_s: int) -> None:
        self._store = store
        self._signer = signer if ttl_s > 0 else None
        self._ttl_s = ttl_s

    async def revision_urls(self, name: str, revision: int = 0) -> RevisionUrls:
        if self._signer is None:
            raise Unimplemented(
                "this adapter store hands out no download URLs (--download-url-ttl 0); "
                "use DownloadAdapter"
            )
        _, manifest = await self._store.get(name, revision)
        # The expiry stated is a little before the signed one: a reader that trusts it
        # never starts a GET in the last moment of a URL's life.
        expire_time = now() + timedelta(seconds=self._ttl_s * 0.9)
        urls = tuple(
            FileUrl(f.name, self._signer.presign_get(blob_key(f.sha256), self._ttl_s))
            for f in manifest.files
        )
        return RevisionUrls(manifest, urls, expire_time)

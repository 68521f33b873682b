"""Where a revision's files can be read: presigned GET URLs of their blobs.

The store decides who may read (the call needs a reader token or better, like every
read) and hands out URLs; the bytes then go from object storage to the replica
without passing through the store. A revision's blobs are immutable and
content-addressed, so a URL always yields the bytes the manifest's SHA-256 names (the
reader checks them anyway). No URL is ever logged; each issue is, with who asked.

A URL stays usable after its caller's token is revoked or the adapter deleted, until
it expires, so it lives only as long as the download needs:
`ttl = min(max_ttl, ceil(URL_TTL_MARGIN_S + revision bytes / min_rate))`, with
`--download-url-ttl` the most and `--download-url-min-rate` the slowest read a
replica is expected to manage. A replica that is slower asks again (it renews URLs
that are about to expire before each file).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from loraserve.adapterstore.blobs import BlobSigner, blob_key
from loraserve.adapterstore.catalog import Adapter, now
from loraserve.common.errors import Unimplemented
from loraserve.common.revisions.manifest import Revision
from loraserve.common.revisions.presigned import FileUrl, RevisionUrls
from loraserve.common.rpc.security import current_principal

log = logging.getLogger(__name__)

# Seconds every URL gets beyond its bytes' reading time: the reply's way back, the
# first GET's connection, and clocks a few seconds apart.
URL_TTL_MARGIN_S = 30
# Bytes per second: a replica that reads slower than this renews its URLs midway.
DEFAULT_URL_MIN_RATE = 2 * 1024 * 1024


class RevisionLookup(Protocol):
    """Finds a revision as any read does (`AdapterStore.get`)."""

    async def get(self, name: str, revision: int = 0) -> tuple[Adapter, Revision]: ...


def url_ttl_s(size: int, max_ttl_s: int, min_rate: int) -> int:
    """Seconds the URLs of a revision of `size` bytes stay valid (the module's formula)."""
    return min(max_ttl_s, math.ceil(URL_TTL_MARGIN_S + size / min_rate))


class DownloadUrls:
    """Signs URLs of revisions' files; with no signer (or `max_ttl_s` 0), Unimplemented,
    which sends replicas to the DownloadAdapter stream. `principal` names the caller
    (the auth layer's, by default) in the log line of each issue."""

    def __init__(
        self,
        store: RevisionLookup,
        signer: BlobSigner | None,
        max_ttl_s: int,
        *,
        min_rate: int = DEFAULT_URL_MIN_RATE,
        principal: Callable[[], str] = current_principal.get,
    ) -> None:
        if min_rate < 1:
            raise ValueError(f"min_rate must be positive, got {min_rate}")
        self._store = store
        self._signer = signer if max_ttl_s > 0 else None
        self._max_ttl_s = max_ttl_s
        self._min_rate = min_rate
        self._principal = principal

    async def revision_urls(self, name: str, revision: int = 0) -> RevisionUrls:
        if self._signer is None:
            raise Unimplemented(
                "this adapter store hands out no download URLs (--download-url-ttl 0); "
                "use DownloadAdapter"
            )
        _, manifest = await self._store.get(name, revision)
        size = sum(f.size for f in manifest.files)
        ttl_s = url_ttl_s(size, self._max_ttl_s, self._min_rate)
        # The expiry stated is a little before the signed one: a reader that trusts it
        # never starts a GET in the last moment of a URL's life.
        expire_time = now() + timedelta(seconds=ttl_s * 0.9)
        urls = tuple(
            FileUrl(f.name, self._signer.presign_get(blob_key(f.sha256), ttl_s))
            for f in manifest.files
        )
        log.info(
            "store.download_urls_issued principal=%s name=%s rev=%d files=%d bytes=%d ttl_s=%d",
            self._principal(),
            manifest.adapter_name,
            manifest.revision,
            len(urls),
            size,
            ttl_s,
        )
        return RevisionUrls(manifest, urls, expire_time)

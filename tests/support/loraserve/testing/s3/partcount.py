"""Counts how many multipart parts an `S3BlobStore` has on the wire at once."""

from __future__ import annotations

import threading
import time
from typing import Any

from loraserve.adapterstore.blobs import S3BlobStore


class PartsOnTheWire:
    """Wraps the store's `upload_part`, holding every part `hold_s` before it is sent
    so that the parts the store starts together overlap; `most` is the peak."""

    def __init__(self, store: S3BlobStore, hold_s: float) -> None:
        self.most = 0
        self._sending = 0
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._upload_part = store.client.upload_part
        store.client.upload_part = self._counting  # type: ignore[method-assign]

    def _counting(self, **kwargs: Any) -> Any:
        with self._lock:
            self._sending += 1
            self.most = max(self.most, self._sending)
        try:
            time.sleep(self._hold_s)
            return self._upload_part(**kwargs)
        finally:
            with self._lock:
                self._sending -= 1

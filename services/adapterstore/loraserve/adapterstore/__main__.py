"""`adapterstore serve ...`: the adapter store server.

The gRPC server starts at once and reports NOT_SERVING until the bucket has been
reached and the log loaded; calls before then get UNAVAILABLE. Storage that does
not honour conditional puts (see storageprobe) stops the store with exit code 1.
SIGTERM or SIGINT turn health to NOT_SERVING and give in-flight calls
`--shutdown-grace` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from loraserve.adapterstore.api import (
    METHOD_ROLES,
    SERVICE_NAME,
    AdapterStoreServicer,
    StoreMetrics,
    follow_freshness,
    register,
)
from loraserve.adapterstore.blobs import S3BlobStore, S3Presigner
from loraserve.adapterstore.changelog import ChangeLog
from loraserve.adapterstore.compat import UnsupportedFormat
from loraserve.adapterstore.compat.gate import FormatGate
from loraserve.adapterstore.files import DownloadUrls
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.adapterstore.settings import AdapterStoreSettings, parse_settings
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.errors import DataLoss, FailedPrecondition, LoraserveError, Unavailable
from loraserve.common.release import RELEASE
from loraserve.common.rpc import retrylog
from loraserve.common.rpc.metrics_http import serve_metrics
from loraserve.common.rpc.server import RunningServer, install_stop_signals, start_server
from loraserve.common.tracing import LOG_FORMAT, start_tracing

log = logging.getLogger("loraserve.adapterstore")

_RETRY_FIRST_S = 0.5
_RETRY_MAX_S = 15.0
EXIT_UNSUITABLE_STORAGE = 1
# The bucket holds what a newer release wrote and this one cannot read (compat/formats.py).
EXIT_UNSUPPORTED_FORMAT = 3


async def _start_when_reachable(
    blobs: S3BlobStore, store: AdapterStore, stop: asyncio.Event
) -> bool:
    """Retries until the bucket answers and the log is loaded; False if stopped first
    (the attempt or wait in progress is cancelled)."""
    starting = asyncio.create_task(_start_with_retries(blobs, store))
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        starting.cancel()
        stopping.cancel()
        await asyncio.gather(starting, stopping, return_exceptions=True)
    if starting.cancelled():
        return False
    starting.result()  # raises FailedPrecondition for unsuitable storage
    return True


async def _start_with_retries(blobs: S3BlobStore, store: AdapterStore) -> None:
    async for attempt in retrylog.retry_context(
        "adapterstore.start",
        on=(Unavailable, DataLoss),
        attempts=None,
        timeout=None,
        wait_initial=_RETRY_FIRST_S,
        wait_max=_RETRY_MAX_S,
    ):
        with attempt:
            try:
                await blobs.check()
                await store.start()
            except (Unavailable, DataLoss) as e:
                log.warning(
                    "store.storage_unreachable retry_in_s=%.1f error=%s",
                    attempt.next_wait,
                    e.message,
                )
                raise


async def _start_grpc(settings: AdapterStoreSettings, store: AdapterStore) -> RunningServer:
    urls = DownloadUrls(
        store,
        S3Presigner(settings.s3, settings.download_url_endpoint),
        settings.download_url_ttl_s,
        min_rate=settings.download_url_min_rate,
    )
    return await start_server(
        address=settings.listen,
        register=register(
            AdapterStoreServicer(store, urls=urls, trace_principals=settings.tracing.principals)
        ),
        service_names=[SERVICE_NAME],
        security=settings.security,
        needs=METHOD_ROLES,
        limits=settings.limits,
        max_connection_age_s=settings.max_connection_age_s,
    )


async def serve(settings: AdapterStoreSettings) -> int:
    blobs = S3BlobStore(
        settings.s3, part_size=settings.part_size, parts_in_flight=settings.parts_in_flight
    )
    statuses = ReplicaStatusStore(blobs, settings.status_ttl_s)
    gate = FormatGate(blobs, statuses.reader, settings.formats, settings.status_ttl_s)
    changelog = ChangeLog(blobs, settings.log, lambda: gate.write_format)
    store = AdapterStore(blobs, changelog, statuses, settings.store)
    running = await _start_grpc(settings, store)
    if settings.metrics_listen is not None:
        metrics = StoreMetrics(store, storage_format=lambda: gate.write_format)
        serve_metrics(metrics.registry, settings.metrics_listen)
    stop = asyncio.Event()
    install_stop_signals(stop)
    log.info(
        "store.starting bucket=%s prefix=%s release=%s store_id=%s",
        settings.s3.bucket,
        settings.s3.prefix,
        RELEASE,
        gate.store_id,
    )
    # Announced from the start, so the other stores hold the format down for this one
    # before it reads anything.
    announcing = asyncio.create_task(gate.run(), name="store-presence")
    health: asyncio.Task[None] | None = None
    exit_code = 0
    try:
        if await _start_when_reachable(blobs, store, stop):
            changelog.write_older_snapshot(settings.formats.storage_format)
            health = asyncio.create_task(follow_freshness(store, running.set_serving))
            log.info("store.serving port=%d seq=%d", running.port, store.head_seq)
            await stop.wait()
        log.info("store.stopping grace_s=%.1f", settings.shutdown_grace_seconds)
    except UnsupportedFormat as e:
        log.error("store.format_unsupported error=%s", e.message)
        exit_code = EXIT_UNSUPPORTED_FORMAT
    except FailedPrecondition as e:
        log.error("store.unsuitable_storage error=%s", e.message)
        exit_code = EXIT_UNSUITABLE_STORAGE
    finally:
        for task in (health, announcing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        store.stop_watches()
        await running.stop(settings.shutdown_grace_seconds)
        await store.close()
    log.info("store.stopped")
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except LoraserveError as e:
        sys.stderr.write(f"adapterstore: {e.message}\n")
        return 2
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    retrylog.install()
    stop_tracing = start_tracing(settings.tracing, "loraserve-adapterstore")
    try:
        return asyncio.run(serve(settings))
    finally:
        # Flushes the spans still batched, so the last pushes before a stop are traced.
        stop_tracing()


if __name__ == "__main__":
    sys.exit(main())

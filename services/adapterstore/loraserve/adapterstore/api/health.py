"""grpc.health.v1 for a store replica: SERVING only while it is in step with storage.

A replica that cannot reach object storage, or whose log poller has stopped,
still answers reads from its last state, but its seq no longer advances. Health
says NOT_SERVING while that lasts, so load balancers and the inference replicas'
health-checking channels send calls to replicas that see new commits, and
SERVING again once it has caught up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from loraserve.adapterstore.store import AdapterStore

log = logging.getLogger(__name__)

# How often freshness is looked at, as a fraction of the staleness limit.
_CHECKS_PER_LIMIT = 10
_MAX_CHECK_INTERVAL_S = 1.0


async def follow_freshness(
    store: AdapterStore, set_serving: Callable[[bool], Awaitable[None]]
) -> None:
    """Keeps health in step with `store.fresh` until cancelled."""
    interval = min(_MAX_CHECK_INTERVAL_S, store.max_staleness_s / _CHECKS_PER_LIMIT)
    serving: bool | None = None
    while True:
        fresh = store.fresh
        if fresh != serving:
            await set_serving(fresh)
            if fresh:
                log.info("store.health_serving seq=%d", store.head_seq)
            elif serving is not None:
                log.warning(
                    "store.health_not_serving seq=%d stale_s=%.1f following=%s",
                    store.head_seq,
                    store.staleness_s,
                    store.following,
                )
            serving = fresh
        await asyncio.sleep(interval)

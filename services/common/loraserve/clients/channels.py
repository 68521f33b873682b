"""How every loraserve client opens its channel: TLS and the bearer token
(`loraserve.common.rpc.security`), the shared message limit, and a service config that
carries gRPC's own retry policy for the calls that are safe to send again.

gRPC retries a call that failed UNAVAILABLE before the server answered anything,
resending the same request message, within the call's one deadline. That is safe
for reads, and for writes whose request carries an idempotency key: the key is in
the message, so every attempt carries the same one. Client-streaming calls are only
retried while what was sent fits gRPC's per-call buffer, so a push retries itself
(`loraserve.clients.push`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from loraserve.common.config.sizes import MESSAGE_LIMIT_OPTIONS
from loraserve.common.rpc.security import ClientSecurity, secure_channel

# gRPC clamps a retry policy's maxAttempts at 5 (and logs it).
MAX_GRPC_ATTEMPTS = 5


@dataclass(frozen=True)
class Retry:
    """A retry policy: at least 2 attempts (gRPC refuses fewer, and takes at most 5),
    each wait drawn at random up to min(initial_backoff_s * 2**n, max_backoff_s)."""

    max_attempts: int
    initial_backoff_s: float
    max_backoff_s: float
    # The statuses retried: UNAVAILABLE, and for calls that are safe to send again
    # whatever became of the first attempt, CANCELLED from the server (see
    # `loraserve.clients.store`).
    codes: tuple[str, ...] = ("UNAVAILABLE",)

    def method_config(self, service: str, methods: Iterable[str] = ()) -> dict[str, Any]:
        """The methodConfig retrying `codes` for `methods` of `service` (all if none)."""
        names = [{"service": service, "method": method} for method in methods]
        return {
            "name": names or [{"service": service}],
            "retryPolicy": {
                "maxAttempts": min(self.max_attempts, MAX_GRPC_ATTEMPTS),
                "initialBackoff": f"{self.initial_backoff_s:g}s",
                "maxBackoff": f"{self.max_backoff_s:g}s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": list(self.codes),
            },
        }


def open_channel(
    address: str,
    security: ClientSecurity,
    *,
    method_configs: Sequence[dict[str, Any]] = (),
    health_checked_service: str | None = None,
    load_balancing: dict[str, Any] | None = None,
    reconnect_backoff_max_s: float | None = None,
    options: Iterable[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """An aio channel to `address` with the shared message limit.

    `method_configs` go into the service config (retry policies). With
    `health_checked_service`, calls go round-robin to the addresses whose
    grpc.health.v1 status for it is SERVING. `load_balancing` is one loadBalancingConfig
    entry instead (ring_hash: `loraserve.clients.routing`). `reconnect_backoff_max_s` bounds gRPC's
    own reconnect backoff (its default, 120 s, leaves a client idle long after the
    server came back). `options` are further channel arguments.
    """
    service_config: dict[str, Any] = {}
    if method_configs:
        service_config["methodConfig"] = list(method_configs)
    if health_checked_service is not None:
        service_config["loadBalancingConfig"] = [{"round_robin": {}}]
        service_config["healthCheckConfig"] = {"serviceName": health_checked_service}
    if load_balancing is not None:
        service_config["loadBalancingConfig"] = [load_balancing]
    channel_options: list[tuple[str, Any]] = list(MESSAGE_LIMIT_OPTIONS)
    if service_config:
        channel_options.append(("grpc.service_config", json.dumps(service_config)))
    if reconnect_backoff_max_s is not None:
        max_ms = max(1, int(reconnect_backoff_max_s * 1000))
        channel_options += [
            ("grpc.initial_reconnect_backoff_ms", min(1000, max_ms)),
            ("grpc.min_reconnect_backoff_ms", min(1000, max_ms)),
            ("grpc.max_reconnect_backoff_ms", max_ms),
        ]
    channel_options += list(options)
    return secure_channel(address, security, channel_options)

"""Who an OpenAI-front request is to the generator: its rollout caller and the trace
context its headers carry."""

from __future__ import annotations

import dataclasses

from fastapi import Request

from loraserve.inference.adapters import ROLLOUT_KEY_HEADER
from loraserve.inference.serving import GenerateCommand, RuntimeRef, TraceOrigin


def for_caller(
    command: GenerateCommand, runtime_ref: RuntimeRef, request: Request, user: str | None
) -> GenerateCommand:
    """`command` with its rollout caller (`RolloutKeys.caller`: the key the request
    claims is the `x-rollout-key` header, else the OpenAI `user` field) and its span's
    origin (the `traceparent` header, if any; OpenTelemetry's http.* attributes)."""
    claimed = request.headers.get(ROLLOUT_KEY_HEADER) or user or ""
    peer = request.client.host if request.client is not None else ""
    caller = runtime_ref.rollout_keys.caller(claimed, peer)
    origin = TraceOrigin(
        request.headers.items(),
        {"http.request.method": request.method, "http.route": request.url.path},
    )
    return dataclasses.replace(
        command, rollout_key=caller.key, rollout_caller=caller.identity, origin=origin
    )

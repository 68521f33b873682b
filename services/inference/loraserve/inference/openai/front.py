"""The OpenAI front as the inference service runs it: the app on its runtime, served on
`--openai-listen` with the service's security and clocks."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from loraserve.inference.openai.app import create_openai_app
from loraserve.inference.openai.server import RunningHttpServer, start_http_server
from loraserve.inference.serving import RuntimeRef
from loraserve.inference.settings import InferenceSettings


async def start_openai_front(
    settings: InferenceSettings,
    address: str,
    runtime_ref: RuntimeRef,
    is_ready: Callable[[], bool],
    metrics: CollectorRegistry,
) -> RunningHttpServer:
    """Serves the OpenAI-compatible API on `address` (`--openai-listen`)."""
    names = dict.fromkeys([settings.compat.served_model_name, settings.engine.model])
    app = create_openai_app(
        runtime_ref,
        model_names=list(names),
        security=settings.security,
        is_ready=is_ready,
        max_body_bytes=settings.openai_max_body_bytes,
        metrics=metrics,
        public_metrics=settings.public_metrics,
        stalled_write_s=settings.limits.stalled_write_s,
    )
    return await start_http_server(
        app,
        address=address,
        security=settings.security,
        name="openai-http",
        stalled_write_s=settings.limits.stalled_write_s,
    )

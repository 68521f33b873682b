"""Starting traces in a process: off unless an OTLP endpoint is configured
(`--otlp-traces-endpoint`, or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
`OTEL_EXPORTER_OTLP_ENDPOINT`), so a default start pays for no-op spans only. Spans go
to the endpoint over OTLP/gRPC in batches; `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` name the process as OpenTelemetry's SDK reads them."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry import trace

from loraserve.common.config.flags import EnvFlags
from loraserve.common.errors import InvalidArgument
from loraserve.common.tracing.propagation import propagate

log = logging.getLogger(__name__)

_STANDARD_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


@dataclass(frozen=True)
class TracingSettings:
    # Where spans go (OTLP/gRPC, e.g. http://otel-collector:4317); None: tracing off.
    endpoint: str | None = None
    # The share of new traces recorded; a request that arrives with a sampled trace
    # context is recorded whatever this says (parent-based).
    sample_ratio: float = 1.0
    # Whether spans name the caller's principal (off: who calls is not every trace
    # backend's business).
    principals: bool = False


def add_tracing_flags(
    parser: argparse.ArgumentParser, env_prefix: str, environ: Mapping[str, str]
) -> None:
    group = parser.add_argument_group("tracing")
    env = EnvFlags(environ, env_prefix)
    env.add(
        group,
        "otlp-traces-endpoint",
        "send OpenTelemetry traces here over OTLP/gRPC (e.g. http://collector:4317); "
        "default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, "
        "else tracing is off",
    )
    env.add(
        group,
        "trace-sample-ratio",
        "share of new traces recorded, 0 to 1; calls that arrive in a sampled trace are "
        "always recorded",
        "1.0",
        type=float,
    )
    group.add_argument(
        "--trace-principals",
        action="store_true",
        default=env.switch("trace-principals"),
        help=f"name the caller's token principal on spans (env {env.env_name('trace-principals')})",
    )


def tracing_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> TracingSettings:
    endpoint = args.otlp_traces_endpoint or next(
        (environ[name] for name in _STANDARD_ENDPOINTS if environ.get(name)), None
    )
    if endpoint is not None:
        endpoint = otlp_endpoint(endpoint)
    ratio = float(args.trace_sample_ratio)
    if not 0.0 <= ratio <= 1.0:
        raise InvalidArgument(f"--trace-sample-ratio must be between 0 and 1, got {ratio}")
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        endpoint = None
    return TracingSettings(endpoint, ratio, bool(args.trace_principals))


def otlp_endpoint(value: str) -> str:
    """`value` if it names an OTLP/gRPC endpoint (http:// or https://, a host, no
    path); else InvalidArgument naming it: an exporter sent elsewhere drops every
    span without a word."""
    url = urlsplit(value.strip())
    try:
        port_ok = url.port is None or url.port > 0
    except ValueError:
        port_ok = False
    if url.scheme not in ("http", "https") or not url.hostname or not port_ok:
        raise InvalidArgument(
            f"the OTLP traces endpoint must be http://HOST:PORT or https://HOST:PORT, got {value!r}"
        )
    if url.path not in ("", "/") or url.query or url.fragment:
        raise InvalidArgument(f"the OTLP traces endpoint takes no path (OTLP/gRPC), got {value!r}")
    return value.strip()


def start_tracing(settings: TracingSettings, service_name: str) -> Callable[[], None]:
    """Installs the process's tracer provider when an endpoint is configured; returns
    what flushes and stops it (a no-op when tracing is off)."""
    install_log_correlation()
    if settings.endpoint is None:
        return lambda: None
    # Imported here: a process with tracing off never loads the SDK or the exporter.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio))
    )
    insecure = settings.endpoint.startswith("http://")
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.endpoint, insecure=insecure))
    )
    trace.set_tracer_provider(provider)
    propagate()
    log.info(
        "tracing.started endpoint=%s sample_ratio=%s", settings.endpoint, settings.sample_ratio
    )
    return provider.shutdown


class _TraceIds(logging.Filter):
    """Puts the current span's ids on a record as `trace` (" trace_id=… span_id=…", or
    "" outside a recorded span), for formats that end with `%(trace)s`."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        record.trace = (
            f" trace_id={context.trace_id:032x} span_id={context.span_id:016x}"
            if context.is_valid
            else ""
        )
        return True


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s%(trace)s"


def install_log_correlation() -> None:
    """Adds the trace ids to every record the root logger's handlers write."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _TraceIds) for f in handler.filters):
            handler.addFilter(_TraceIds())

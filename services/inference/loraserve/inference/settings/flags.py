"""The `inference` command line: flags with `INFERENCE_<FLAG>` env fallbacks, parsed
once into `InferenceSettings`."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from loraserve.common.config.admission import add_admission_flags, admission_from_args
from loraserve.common.config.flags import (
    EnvFlags,
    fraction,
    non_negative_float,
    non_negative_int,
    parse_args,
    positive_float,
    positive_int,
)
from loraserve.common.config.pins import add_pin_flags, pin_settings_from_args
from loraserve.common.config.sizes import parse_size
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.limits import add_server_limit_flags, server_limits_from_args
from loraserve.common.rpc.metrics_http import add_metrics_flags, metrics_address
from loraserve.common.rpc.security import (
    add_client_security_flags,
    add_server_security_flags,
    client_security_from_args,
    server_security_from_args,
)
from loraserve.common.tracing import add_tracing_flags, tracing_from_args
from loraserve.common.trust.policy import add_trust_flags, trust_settings_from_args
from loraserve.inference.settings.options import (
    DEFAULT_MAX_N,
    DEFAULT_METRICS_TOP_ADAPTERS,
    ENV_PREFIX,
    GRPC_TRANSPORTS,
    STORE_FLAG_PREFIX,
    CompatOptions,
    EngineOptions,
    InferenceSettings,
)
from loraserve.inference.settings.shutdown import add_shutdown_flags


def _cache_size(text: str) -> int:
    size = parse_size(text)
    if size < 1:
        raise argparse.ArgumentTypeError("the adapter cache needs at least one byte")
    return size


def _rank(text: str) -> int | None:
    if text == "auto":
        return None
    return positive_int(text)


def parse_engine_arg(item: str) -> tuple[str, object]:
    """Parses `KEY=VALUE`; VALUE is JSON if it parses as JSON, else a string."""
    key, sep, raw = item.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise InvalidArgument(f"--engine-arg expects KEY=VALUE, got {item!r}")
    try:
        value: object = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key, value


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The `inference` command line; defaults come from `environ`."""
    parser = argparse.ArgumentParser(prog="inference", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the inference server")
    flags = EnvFlags(environ, ENV_PREFIX)
    _add_model_flags(serve, flags)
    _add_store_flags(serve, flags)
    add_trust_flags(functools.partial(flags.add, serve))
    add_admission_flags(functools.partial(flags.add, serve))
    add_pin_flags(functools.partial(flags.add, serve))
    _add_cache_flags(serve, flags)
    _add_serving_flags(serve, flags)
    add_metrics_flags(serve, flags)
    _add_connection_flags(serve, flags)
    add_server_limit_flags(serve, flags)
    _add_engine_flags(serve.add_argument_group("engine"), flags)
    add_server_security_flags(serve, ENV_PREFIX, environ, roles=("reader", "pinner"))
    add_client_security_flags(serve, ENV_PREFIX, environ, flag_prefix=STORE_FLAG_PREFIX)
    add_tracing_flags(serve, ENV_PREFIX, environ)
    return parser


def _add_cache_flags(serve: argparse.ArgumentParser, flags: EnvFlags) -> None:
    """Where downloaded adapters live, how many bytes, what is loaded ahead, how read."""
    env = flags.get
    serve.add_argument(
        "--adapter-cache",
        type=Path,
        default=env("adapter-cache", "adapter-cache"),
        help="directory for downloaded adapters; nothing outside it is ever loaded",
    )
    serve.add_argument(
        "--adapter-cache-size",
        type=_cache_size,
        default=env("adapter-cache-size"),
        metavar="BYTES",
        help="most bytes the adapter cache holds on disk (e.g. 20GiB); least recently used "
        "revisions no request holds are evicted to stay under it; unset: unbounded",
    )
    serve.add_argument(
        "--prefetch-adapters",
        type=non_negative_int,
        default=env("prefetch-adapters", "32"),
        metavar="N",
        help="adapters loaded before the server reports SERVING (the ones this replica "
        "served most recently first) and loaded as soon as they are published while fewer "
        "than N are loaded; every other adapter loads on its first request",
    )
    serve.add_argument(
        "--adapter-download",
        choices=("direct", "stream"),
        default=env("adapter-download", "direct"),
        help="direct: read adapter files from object storage with the store's presigned "
        "URLs, else through the store's stream; stream: always through the store's stream",
    )
    serve.add_argument(
        "--download-range-size",
        type=parse_size,
        default=env("download-range-size", "0"),
        metavar="BYTES",
        help="read files at least twice this long from object storage as parallel ranged "
        "GETs of this size (e.g. 16MiB; pays on AWS S3); 0: one streamed GET per file",
    )


def _add_serving_flags(serve: argparse.ArgumentParser, flags: EnvFlags) -> None:
    """Where requests arrive and how many are admitted."""
    env = flags.get
    serve.add_argument("--replica-id", default=env("replica-id"), help="default: host name")
    serve.add_argument("--listen", default=env("listen", "0.0.0.0:50052"), help="gRPC address")
    serve.add_argument(
        "--grpc-transport",
        choices=GRPC_TRANSPORTS,
        default=env("grpc-transport", "auto"),
        help="what serves Generate on --listen: grpcio (grpc.aio serves everything); native "
        "(Rust's HTTP/2, the engine's outputs written as they are made, about half the "
        "front's CPU per token; every other call is carried to the grpc.aio server on a "
        "Unix socket): not yet hardened against hostile peers (no limits on streams, "
        "bodies or time, and one malformed frame can stop every call: the replica then "
        "reports NOT_SERVING and exits 1), so only for trusted networks; auto: grpcio "
        "until the native transport passes the abuse suite",
    )
    serve.add_argument(
        "--openai-listen",
        default=env("openai-listen"),
        metavar="HOST:PORT",
        help="serve the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, "
        "/v1/models) here, with the same tokens and TLS as gRPC; unset: off",
    )
    serve.add_argument(
        "--openai-max-body-size",
        type=parse_size,
        default=env("openai-max-body-size", "16MiB"),
        metavar="SIZE",
        help="largest HTTP request body (e.g. 16MiB); a larger one gets 413 before it is read",
    )
    serve.add_argument(
        "--max-pending-requests",
        type=positive_int,
        default=env("max-pending-requests", "256"),
        help="sequences admitted at once, a request counting its n (choices); more get "
        "RESOURCE_EXHAUSTED",
    )
    serve.add_argument(
        "--max-n",
        type=positive_int,
        default=env("max-n"),
        metavar="N",
        help=f"most choices (n) a request may ask for per prompt; more is INVALID_ARGUMENT "
        f"(default: {DEFAULT_MAX_N}, or --max-pending-requests if lower)",
    )
    serve.add_argument(
        "--trust-rollout-key-header",
        action="store_true",
        default=flags.switch("trust-rollout-key-header"),
        help="let the x-rollout-key header (or the OpenAI `user` field) pick a rollout's arm "
        "and name the caller in the guard's figures: only behind a gateway that sets it for "
        "its end users, since a caller that chooses its key chooses its arm; default off: "
        "the caller's token principal is its key (env INFERENCE_TRUST_ROLLOUT_KEY_HEADER)",
    )


def _add_connection_flags(serve: argparse.ArgumentParser, flags: EnvFlags) -> None:
    """How connections, metrics scrapers and shutdown are treated."""
    env = flags.get
    serve.add_argument(
        "--public-metrics",
        action="store_true",
        default=flags.switch("public-metrics"),
        help="serve /metrics on the OpenAI port without a token, for scrapers that send "
        "none (an inference-gateway endpoint picker); otherwise it takes a token like "
        "every other path there (env INFERENCE_PUBLIC_METRICS)",
    )
    serve.add_argument(
        "--metrics-top-adapters",
        type=non_negative_int,
        default=env("metrics-top-adapters", str(DEFAULT_METRICS_TOP_ADAPTERS)),
        metavar="K",
        help="per-adapter metrics name the K adapters with the most requests lately "
        '(re-ranked every minute) and count the others as adapter="_other"',
    )
    serve.add_argument(
        "--max-connection-age",
        type=non_negative_float,
        default=env("max-connection-age", "300"),
        metavar="SECONDS",
        help="ask each gRPC connection to close (GOAWAY) once this old; its calls finish, "
        "and clients reconnect, resolving dns:/// targets again, so new replicas get "
        "traffic (0: never)",
    )
    add_shutdown_flags(serve, env)
    serve.add_argument("--log-level", default=env("log-level", "INFO"))


def _add_model_flags(serve: argparse.ArgumentParser, flags: EnvFlags) -> None:
    env = flags.get
    serve.add_argument(
        "--model",
        default=env("model"),
        required=env("model") is None,
        help="model path (or name) for the engine (env INFERENCE_MODEL)",
    )
    serve.add_argument(
        "--served-model-name",
        default=env("served-model-name"),
        help="name adapters' base_model must match; default: the model path's last part",
    )
    serve.add_argument(
        "--allow-base-model-mismatch",
        action="store_true",
        default=flags.switch("allow-base-model-mismatch"),
        help="load adapters whose base_model names another model",
    )


def _add_store_flags(serve: argparse.ArgumentParser, flags: EnvFlags) -> None:
    env = flags.get
    serve.add_argument(
        "--store",
        default=env("store"),
        required=env("store") is None,
        help="adapter store gRPC target: HOST:PORT, or one naming every store replica "
        "(dns:///NAME:PORT, ipv4:IP:PORT,IP:PORT); calls go round-robin to the replicas "
        "whose health is SERVING (env INFERENCE_STORE)",
    )
    serve.add_argument(
        "--store-max-staleness",
        type=positive_float,
        default=env("store-max-staleness", "30"),
        help="seconds a store replica may go without confirming its seq against object "
        "storage (as its watch heartbeats say) before the watch moves to another replica",
    )
    serve.add_argument(
        "--status-interval",
        type=positive_float,
        default=env("status-interval", "60"),
        help="longest time in seconds between this replica's reports to the store, which "
        "shows it as stale after two missed and forgets it after its --status-ttl",
    )
    serve.add_argument(
        "--status-flush-interval",
        type=positive_float,
        default=env("status-flush-interval", "1"),
        help="seconds within which a change of what this replica routes (a revision "
        "routed, loaded or refused) is reported to the store, batched",
    )
    serve.add_argument(
        "--rollout-report-interval",
        type=positive_float,
        default=env("rollout-report-interval", "10"),
        help="seconds between reports of the per-revision counts of adapters in a rollout, "
        "which the store's guards judge",
    )


def _add_engine_flags(engine: argparse._ArgumentGroup, flags: EnvFlags) -> None:
    env = flags.get
    engine.add_argument("--max-loras", type=positive_int, default=env("max-loras", "4"))
    engine.add_argument(
        "--max-lora-rank",
        type=_rank,
        default=env("max-lora-rank", "16"),
        help="N, or auto: the smallest vLLM rank covering every adapter in the store",
    )
    engine.add_argument("--max-cpu-loras", type=positive_int, default=env("max-cpu-loras"))
    engine.add_argument(
        "--gpu-memory-utilization", type=fraction, default=env("gpu-memory-utilization", "0.9")
    )
    engine.add_argument("--max-model-len", type=positive_int, default=env("max-model-len"))
    engine.add_argument("--dtype", default=env("dtype", "auto"))
    engine.add_argument("--lora-dtype", default=env("lora-dtype", "auto"))
    engine.add_argument("--cpu-offload-gb", type=float, default=env("cpu-offload-gb", "0"))
    engine.add_argument(
        "--engine-arg",
        action="append",
        default=[item for item in (env("engine-args") or "").split(";") if item],
        metavar="KEY=VALUE",
        help="any other vLLM engine argument, VALUE as JSON (repeatable; "
        "env INFERENCE_ENGINE_ARGS, ';'-separated)",
    )


def parse_settings(
    argv: Sequence[str], environ: Mapping[str, str], hostname: str
) -> InferenceSettings:
    """Parses `inference serve ...`; raises InvalidArgument for inconsistent flags."""
    args = parse_args(build_parser(environ), argv)
    max_pending = int(args.max_pending_requests)
    max_n = int(args.max_n) if args.max_n is not None else min(DEFAULT_MAX_N, max_pending)
    if max_n > max_pending:
        raise InvalidArgument(
            f"--max-n ({max_n}) must be at most --max-pending-requests ({max_pending}): "
            "a request with more choices than that could never be admitted"
        )
    engine = _engine_options(args)
    model = engine.model
    security = server_security_from_args(args)
    return InferenceSettings(
        engine=engine,
        compat=CompatOptions(
            served_model_name=args.served_model_name or Path(model.rstrip("/")).name,
            require_base_model_match=not args.allow_base_model_mismatch,
        ),
        store_address=args.store,
        store_security=client_security_from_args(args, STORE_FLAG_PREFIX),
        adapter_cache=Path(args.adapter_cache),
        replica_id=args.replica_id or hostname,
        listen=args.listen,
        grpc_transport=args.grpc_transport,
        security=security,
        max_pending_requests=max_pending,
        max_n=max_n,
        trust_rollout_key_header=bool(args.trust_rollout_key_header),
        openai_listen=args.openai_listen or None,
        status_interval_s=float(args.status_interval),
        status_flush_s=float(args.status_flush_interval),
        rollout_report_interval_s=float(args.rollout_report_interval),
        store_max_staleness_s=float(args.store_max_staleness),
        openai_max_body_bytes=int(args.openai_max_body_size),
        metrics_listen=metrics_address(args, args.listen, loopback_only=security.loopback_only),
        public_metrics=bool(args.public_metrics),
        metrics_top_adapters=int(args.metrics_top_adapters),
        max_connection_age_s=float(args.max_connection_age),
        limits=server_limits_from_args(args),
        shutdown_delay_seconds=float(args.shutdown_delay),
        shutdown_grace_seconds=float(args.shutdown_grace),
        log_level=str(args.log_level).upper(),
        adapter_cache_size=args.adapter_cache_size,
        prefetch_adapters=int(args.prefetch_adapters),
        trust=trust_settings_from_args(args),
        admission=admission_from_args(args),
        pins=pin_settings_from_args(args),
        direct_downloads=args.adapter_download == "direct",
        download_range_size=int(args.download_range_size),
        tracing=tracing_from_args(args, environ),
    )


def _engine_options(args: argparse.Namespace) -> EngineOptions:
    """The engine's part of the command line; raises InvalidArgument for inconsistent flags."""
    extra = dict(parse_engine_arg(item) for item in args.engine_arg)
    max_loras = int(args.max_loras)
    max_cpu_loras = int(args.max_cpu_loras) if args.max_cpu_loras is not None else None
    if max_cpu_loras is not None and max_cpu_loras < max_loras:
        raise InvalidArgument(
            f"--max-cpu-loras ({max_cpu_loras}) must be at least --max-loras ({max_loras})"
        )
    model = str(args.model)
    engine = EngineOptions(
        model=model,
        max_loras=max_loras,
        max_lora_rank=args.max_lora_rank,
        max_cpu_loras=max_cpu_loras,
        gpu_memory_utilization=float(args.gpu_memory_utilization),
        max_model_len=int(args.max_model_len) if args.max_model_len is not None else None,
        dtype=args.dtype,
        lora_dtype=args.lora_dtype,
        cpu_offload_gb=float(args.cpu_offload_gb),
        extra=extra,
    )
    return engine

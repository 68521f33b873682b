"""What the inference service runs with: one frozen settings object and its parts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loraserve.common.config.admission import AdmissionOptions
from loraserve.common.config.pins import PinSettings
from loraserve.common.rpc.limits import ServerLimits
from loraserve.common.rpc.security import (
    ClientSecurity,
    ServerSecurity,
)
from loraserve.common.tracing import TracingSettings
from loraserve.common.trust.policy import TrustSettings

ENV_PREFIX = "INFERENCE"
STORE_FLAG_PREFIX = "store"


# What may serve Generate on the gRPC address (see InferenceSettings.grpc_transport).
GRPC_TRANSPORTS = ("auto", "native", "grpcio")

# OpenAI's own limit on n.
DEFAULT_MAX_N = 128

# Room for a prompt as long as gRPC's message limit allows.
DEFAULT_OPENAI_MAX_BODY_BYTES = 16 * 1024 * 1024

# Adapters with series of their own in the per-adapter metrics (the rest: `_other`).
DEFAULT_METRICS_TOP_ADAPTERS = 50


@dataclass(frozen=True)
class EngineOptions:
    """What the vLLM engine is started with."""

    model: str
    max_loras: int = 4
    # None means "auto": resolved from the store's adapters before the engine starts.
    max_lora_rank: int | None = 16
    max_cpu_loras: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    dtype: str = "auto"
    lora_dtype: str = "auto"
    cpu_offload_gb: float = 0.0
    # Passthrough `--engine-arg KEY=VALUE`, values JSON-decoded.
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class CompatOptions:
    """How strictly adapters are checked against the served model."""

    # Compared with each adapter's base_model_name_or_path basename.
    served_model_name: str
    require_base_model_match: bool = True


@dataclass(frozen=True)
class InferenceSettings:
    """Everything `inference serve` runs with."""

    engine: EngineOptions
    compat: CompatOptions
    store_address: str
    store_security: ClientSecurity
    adapter_cache: Path
    replica_id: str
    listen: str
    security: ServerSecurity
    # Sequences admitted at once (a request counts its n).
    max_pending_requests: int = 256
    # A caller-supplied rollout key (x-rollout-key, OpenAI `user`) picks a rollout's arm
    # and names the caller; off: the caller's principal does (adapters.rollouts).
    trust_rollout_key_header: bool = False
    # Most choices (n) one request may ask for per prompt.
    max_n: int = DEFAULT_MAX_N
    # What serves Generate on `listen`: "native" (Rust's h2, the engine's outputs pushed;
    # grpc.aio serves every other call behind it), "grpcio", or "auto" (native where built).
    grpc_transport: str = "auto"
    # HOST:PORT of the OpenAI-compatible HTTP front; None: off.
    openai_listen: str | None = None
    # Longest time between reports to the store (see sync.ReportSettings).
    status_interval_s: float = 60.0
    # A change of what this replica routes reaches the store within about this.
    status_flush_s: float = 1.0
    # How often a rollout's counters go to the store while it is active.
    rollout_report_interval_s: float = 10.0
    # See StoreClientSettings.max_staleness_s.
    store_max_staleness_s: float = 30.0
    # Largest HTTP request body the front reads; larger ones get 413 unread.
    openai_max_body_bytes: int = DEFAULT_OPENAI_MAX_BODY_BYTES
    # HOST:PORT of the metrics endpoint; None: off.
    metrics_listen: str | None = None
    # /metrics on the OpenAI port without a token.
    public_metrics: bool = False
    # Adapters the per-adapter metrics name; the others count as adapter="_other".
    metrics_top_adapters: int = DEFAULT_METRICS_TOP_ADAPTERS
    # Seconds before a gRPC connection is asked to close; 0: never.
    max_connection_age_s: float = 300.0
    # What one gRPC peer may hold: streams, connections, calls, time, unread output.
    limits: ServerLimits = field(default_factory=ServerLimits)
    # Seconds NOT_SERVING while still serving new calls, before the grace.
    shutdown_delay_seconds: float = 0.0
    shutdown_grace_seconds: float = 30.0
    log_level: str = "INFO"
    # Bytes the adapter cache may hold on disk; None: unbounded.
    adapter_cache_size: int | None = None
    # Adapters loaded before SERVING and kept warm on publish (see SyncSettings).
    prefetch_adapters: int = 32
    # Which revisions' signatures this replica requires and trusts.
    trust: TrustSettings = field(default_factory=TrustSettings)
    admission: AdmissionOptions = field(default_factory=AdmissionOptions)
    # Which pinned revisions (NAME@REV) requests may ask for; the engine sets max_pinned.
    pins: PinSettings = field(default_factory=PinSettings)
    # Downloads read object storage with presigned URLs (else the store's stream).
    direct_downloads: bool = True
    # Files at least twice this long are read in parallel ranges; 0: one GET a file.
    download_range_size: int = 0
    # Where this replica's spans go, and how many; off unless an endpoint is configured.
    tracing: TracingSettings = field(default_factory=TracingSettings)

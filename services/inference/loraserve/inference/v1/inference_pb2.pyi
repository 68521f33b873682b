import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]

class AdapterState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADAPTER_STATE_UNSPECIFIED: _ClassVar[AdapterState]
    ADAPTER_STATE_LOADING: _ClassVar[AdapterState]
    ADAPTER_STATE_READY: _ClassVar[AdapterState]
    ADAPTER_STATE_DRAINING: _ClassVar[AdapterState]
    ADAPTER_STATE_FAILED: _ClassVar[AdapterState]
    ADAPTER_STATE_AVAILABLE: _ClassVar[AdapterState]

class AdapterTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADAPTER_TIER_UNSPECIFIED: _ClassVar[AdapterTier]
    ADAPTER_TIER_SLOT: _ClassVar[AdapterTier]
    ADAPTER_TIER_HOST: _ClassVar[AdapterTier]
    ADAPTER_TIER_DISK: _ClassVar[AdapterTier]
    ADAPTER_TIER_STORE: _ClassVar[AdapterTier]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
ADAPTER_STATE_UNSPECIFIED: AdapterState
ADAPTER_STATE_LOADING: AdapterState
ADAPTER_STATE_READY: AdapterState
ADAPTER_STATE_DRAINING: AdapterState
ADAPTER_STATE_FAILED: AdapterState
ADAPTER_STATE_AVAILABLE: AdapterState
ADAPTER_TIER_UNSPECIFIED: AdapterTier
ADAPTER_TIER_SLOT: AdapterTier
ADAPTER_TIER_HOST: AdapterTier
ADAPTER_TIER_DISK: AdapterTier
ADAPTER_TIER_STORE: AdapterTier

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "ignore_eos", "n", "min_p", "min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens", "logit_bias", "bad_words", "logprobs", "prompt_logprobs", "structured_output", "stream_interval")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPACES_BETWEEN_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    n: int
    min_p: float
    min_tokens: int
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    logit_bias: _containers.ScalarMap[int, float]
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    logprobs: int
    prompt_logprobs: int
    structured_output: StructuredOutput
    stream_interval: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., n: _Optional[int] = ..., min_p: _Optional[float] = ..., min_tokens: _Optional[int] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., spaces_between_special_tokens: _Optional[bool] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., bad_words: _Optional[_Iterable[str]] = ..., logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ..., stream_interval: _Optional[int] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("json_schema", "regex", "choice", "grammar", "json_object")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    regex: str
    choice: Choices
    grammar: str
    json_object: bool
    def __init__(self, json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ..., json_object: _Optional[bool] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "rank", "text")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    rank: int
    text: str
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., rank: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class PositionLogprobs(_message.Message):
    __slots__ = ("token", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: TokenLogprob
    top: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token: _Optional[_Union[TokenLogprob, _Mapping]] = ..., top: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("adapter", "text", "token_ids", "sampling", "request_id")
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    adapter: str
    text: str
    token_ids: TokenIds
    sampling: SamplingParams
    request_id: str
    def __init__(self, adapter: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "adapter_name", "revision", "finish_reason", "usage", "request_id", "index", "logprobs", "prompt_logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    adapter_name: str
    revision: int
    finish_reason: FinishReason
    usage: Usage
    request_id: str
    index: int
    logprobs: _containers.RepeatedCompositeFieldContainer[PositionLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[PositionLogprobs]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., adapter_name: _Optional[str] = ..., revision: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., request_id: _Optional[str] = ..., index: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[PositionLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[PositionLogprobs, _Mapping]]] = ...) -> None: ...

class ListAdaptersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdapterRevisionStatus(_message.Message):
    __slots__ = ("name", "revision", "state", "current", "in_flight", "lora_int_id", "rank", "last_error", "tier", "candidate", "rollout_weight")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LORA_INT_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    state: AdapterState
    current: bool
    in_flight: int
    lora_int_id: int
    rank: int
    last_error: str
    tier: AdapterTier
    candidate: bool
    rollout_weight: float
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ..., state: _Optional[_Union[AdapterState, str]] = ..., current: _Optional[bool] = ..., in_flight: _Optional[int] = ..., lora_int_id: _Optional[int] = ..., rank: _Optional[int] = ..., last_error: _Optional[str] = ..., tier: _Optional[_Union[AdapterTier, str]] = ..., candidate: _Optional[bool] = ..., rollout_weight: _Optional[float] = ...) -> None: ...

class ListAdaptersResponse(_message.Message):
    __slots__ = ("adapters", "store_seq")
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    STORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterRevisionStatus]
    store_seq: int
    def __init__(self, adapters: _Optional[_Iterable[_Union[AdapterRevisionStatus, _Mapping]]] = ..., store_seq: _Optional[int] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineSettings(_message.Message):
    __slots__ = ("max_loras", "max_lora_rank", "max_cpu_loras", "max_model_len", "dtype", "lora_dtype", "gpu_memory_utilization", "device", "max_pending_requests")
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_CPU_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LORA_DTYPE_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    max_model_len: int
    dtype: str
    lora_dtype: str
    gpu_memory_utilization: float
    device: str
    max_pending_requests: int
    def __init__(self, max_loras: _Optional[int] = ..., max_lora_rank: _Optional[int] = ..., max_cpu_loras: _Optional[int] = ..., max_model_len: _Optional[int] = ..., dtype: _Optional[str] = ..., lora_dtype: _Optional[str] = ..., gpu_memory_utilization: _Optional[float] = ..., device: _Optional[str] = ..., max_pending_requests: _Optional[int] = ...) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("model", "vllm_version", "engine", "running_requests", "waiting_requests", "kv_cache_usage", "loaded_adapters", "replica_id", "store_seq", "tiers", "loraserve_version")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VLLM_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    LOADED_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    LORASERVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    model: str
    vllm_version: str
    engine: EngineSettings
    running_requests: int
    waiting_requests: int
    kv_cache_usage: float
    loaded_adapters: int
    replica_id: str
    store_seq: int
    tiers: AdapterTiers
    loraserve_version: str
    def __init__(self, model: _Optional[str] = ..., vllm_version: _Optional[str] = ..., engine: _Optional[_Union[EngineSettings, _Mapping]] = ..., running_requests: _Optional[int] = ..., waiting_requests: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., loaded_adapters: _Optional[int] = ..., replica_id: _Optional[str] = ..., store_seq: _Optional[int] = ..., tiers: _Optional[_Union[AdapterTiers, _Mapping]] = ..., loraserve_version: _Optional[str] = ...) -> None: ...

class GetReplicaLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReplicaLoadResponse(_message.Message):
    __slots__ = ("pending_sequences", "max_pending_sequences", "resident_adapters", "replica_id", "adapter_pending_sequences", "adapter_admission_rates", "admission_rates_as_of", "adapter_tokens_per_sequence", "reports_tokens_per_sequence")
    class AdapterPendingSequencesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AdapterAdmissionRatesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class AdapterTokensPerSequenceEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PENDING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_PENDING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_PENDING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_ADMISSION_RATES_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_RATES_AS_OF_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_TOKENS_PER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REPORTS_TOKENS_PER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    pending_sequences: int
    max_pending_sequences: int
    resident_adapters: _containers.RepeatedScalarFieldContainer[str]
    replica_id: str
    adapter_pending_sequences: _containers.ScalarMap[str, int]
    adapter_admission_rates: _containers.ScalarMap[str, float]
    admission_rates_as_of: _timestamp_pb2.Timestamp
    adapter_tokens_per_sequence: _containers.ScalarMap[str, float]
    reports_tokens_per_sequence: bool
    def __init__(self, pending_sequences: _Optional[int] = ..., max_pending_sequences: _Optional[int] = ..., resident_adapters: _Optional[_Iterable[str]] = ..., replica_id: _Optional[str] = ..., adapter_pending_sequences: _Optional[_Mapping[str, int]] = ..., adapter_admission_rates: _Optional[_Mapping[str, float]] = ..., admission_rates_as_of: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., adapter_tokens_per_sequence: _Optional[_Mapping[str, float]] = ..., reports_tokens_per_sequence: _Optional[bool] = ...) -> None: ...

class AdapterTiers(_message.Message):
    __slots__ = ("slots_in_use", "slot_capacity", "host_adapters", "host_capacity", "engine_adapters", "disk_revisions", "disk_bytes", "disk_capacity_bytes", "routed_adapters", "engine_misses", "disk_misses", "engine_evictions", "disk_evictions", "downloads", "load_wait_seconds_p50", "load_wait_seconds_p99")
    SLOTS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    SLOT_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HOST_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    HOST_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    DISK_REVISIONS_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROUTED_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_MISSES_FIELD_NUMBER: _ClassVar[int]
    DISK_MISSES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    DISK_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    DOWNLOADS_FIELD_NUMBER: _ClassVar[int]
    LOAD_WAIT_SECONDS_P50_FIELD_NUMBER: _ClassVar[int]
    LOAD_WAIT_SECONDS_P99_FIELD_NUMBER: _ClassVar[int]
    slots_in_use: int
    slot_capacity: int
    host_adapters: int
    host_capacity: int
    engine_adapters: int
    disk_revisions: int
    disk_bytes: int
    disk_capacity_bytes: int
    routed_adapters: int
    engine_misses: int
    disk_misses: int
    engine_evictions: int
    disk_evictions: int
    downloads: int
    load_wait_seconds_p50: float
    load_wait_seconds_p99: float
    def __init__(self, slots_in_use: _Optional[int] = ..., slot_capacity: _Optional[int] = ..., host_adapters: _Optional[int] = ..., host_capacity: _Optional[int] = ..., engine_adapters: _Optional[int] = ..., disk_revisions: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., disk_capacity_bytes: _Optional[int] = ..., routed_adapters: _Optional[int] = ..., engine_misses: _Optional[int] = ..., disk_misses: _Optional[int] = ..., engine_evictions: _Optional[int] = ..., disk_evictions: _Optional[int] = ..., downloads: _Optional[int] = ..., load_wait_seconds_p50: _Optional[float] = ..., load_wait_seconds_p99: _Optional[float] = ...) -> None: ...

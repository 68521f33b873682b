"""InferenceService over gRPC: translates proto messages to domain calls and back."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry.util.types import AttributeValue

from loraserve.common.release import RELEASE
from loraserve.common.rpc.sampling_fields import OPTIONAL_SAMPLING_FIELDS
from loraserve.inference.adapters import (
    ROLLOUT_KEY_HEADER,
    RevisionLife,
    RevisionStatus,
    RolloutCaller,
    RolloutKeys,
    Tier,
    TierUsage,
    peer_host,
)
from loraserve.inference.engine import (
    PositionLogprobs,
    SamplingRequest,
    StructuredOutput,
    TokenLogprob,
)
from loraserve.inference.serving.generation import FinishReason, GenerateCommand, GenerationChunk
from loraserve.inference.serving.runtime import RuntimeRef
from loraserve.inference.serving.spans import TraceOrigin
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
GENERATE_METHOD = f"/{SERVICE_NAME}/Generate"
# What a Generate's span says of the call (OpenTelemetry's rpc.* conventions).
GRPC_GENERATE_SPAN: Mapping[str, AttributeValue] = {
    "rpc.system": "grpc",
    "rpc.service": SERVICE_NAME,
    "rpc.method": "Generate",
}

Context = grpc.aio.ServicerContext[Any, Any]

_FINISH = {
    None: pb.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
}
_STATE = {
    RevisionLife.LOADING: pb.ADAPTER_STATE_LOADING,
    RevisionLife.READY: pb.ADAPTER_STATE_READY,
    RevisionLife.DRAINING: pb.ADAPTER_STATE_DRAINING,
    RevisionLife.FAILED: pb.ADAPTER_STATE_FAILED,
    RevisionLife.AVAILABLE: pb.ADAPTER_STATE_AVAILABLE,
}
_TIER = {
    Tier.SLOT: pb.ADAPTER_TIER_SLOT,
    Tier.HOST: pb.ADAPTER_TIER_HOST,
    Tier.DISK: pb.ADAPTER_TIER_DISK,
    Tier.STORE: pb.ADAPTER_TIER_STORE,
}


class InferenceServicer(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, runtime_ref: RuntimeRef) -> None:
        self._runtime_ref = runtime_ref

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        runtime = self._runtime_ref.get()
        metadata = context.invocation_metadata() or ()
        caller = rollout_caller(self._runtime_ref.rollout_keys, metadata, context.peer())
        origin = TraceOrigin(metadata, GRPC_GENERATE_SPAN)
        chunks = runtime.generator.generate(generate_command(request, caller, origin))
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield generate_response(chunk)

    async def ListAdapters(
        self, request: pb.ListAdaptersRequest, context: Context
    ) -> pb.ListAdaptersResponse:
        runtime = self._runtime_ref.get()
        host = await runtime.tiers.host_ids() if runtime.tiers is not None else None
        statuses = runtime.registry.snapshot(host.__contains__ if host is not None else None)
        return pb.ListAdaptersResponse(
            adapters=[_status(s) for s in statuses],
            store_seq=runtime.store_seq(),
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        runtime = self._runtime_ref.get()
        info = runtime.engine.info
        stats = runtime.engine.stats()
        tiers = None
        if runtime.tiers is not None:
            await runtime.tiers.host_ids()
            tiers = _tiers(runtime.tiers.usage())
        return pb.GetServerInfoResponse(
            model=info.model,
            vllm_version=info.version,
            loraserve_version=RELEASE,
            engine=pb.EngineSettings(
                max_loras=info.max_loras,
                max_lora_rank=info.max_lora_rank,
                max_cpu_loras=info.max_cpu_loras,
                max_model_len=info.max_model_len,
                dtype=info.dtype,
                lora_dtype=info.lora_dtype,
                gpu_memory_utilization=info.gpu_memory_utilization,
                device=info.device,
                max_pending_requests=runtime.admission.max_pending,
            ),
            running_requests=stats.running,
            waiting_requests=stats.waiting,
            kv_cache_usage=stats.kv_cache_usage,
            loaded_adapters=runtime.registry.counts().loaded,
            replica_id=runtime.replica_id,
            store_seq=runtime.store_seq(),
            tiers=tiers,
        )

    async def GetReplicaLoad(
        self, request: pb.GetReplicaLoadRequest, context: Context
    ) -> pb.GetReplicaLoadResponse:
        # Reads counters already kept: no engine call, so a poll costs almost nothing.
        runtime = self._runtime_ref.get()
        rates = runtime.admission.admission_rates()
        as_of = Timestamp()
        as_of.FromNanoseconds(round(runtime.admission.admission_rates_as_of * 1e9))
        return pb.GetReplicaLoadResponse(
            pending_sequences=runtime.admission.pending,
            max_pending_sequences=runtime.admission.max_pending,
            resident_adapters=runtime.registry.resident_names(),
            replica_id=runtime.replica_id,
            adapter_pending_sequences=runtime.admission.pending_by_adapter(),
            adapter_admission_rates=rates,
            admission_rates_as_of=as_of,
            adapter_tokens_per_sequence=runtime.admission.tokens_per_sequence(rates),
            reports_tokens_per_sequence=True,
        )


def register(server: grpc.aio.Server, runtime_ref: RuntimeRef) -> None:
    pb_grpc.add_InferenceServiceServicer_to_server(InferenceServicer(runtime_ref), server)


def rollout_caller(
    keys: RolloutKeys, metadata: Iterable[tuple[str, str | bytes]], peer: str = ""
) -> RolloutCaller:
    """Who the call is to a rollout; its `x-rollout-key` metadata counts as `keys` say.
    `peer`: gRPC's name of the caller's address, "" where the front has none."""
    claimed = ""
    for key, value in metadata:
        if key == ROLLOUT_KEY_HEADER:
            claimed = value if isinstance(value, str) else value.decode(errors="replace")
            break
    return keys.caller(claimed, peer_host(peer))


def generate_command(
    request: pb.GenerateRequest,
    caller: RolloutCaller | None = None,
    origin: TraceOrigin | None = None,
) -> GenerateCommand:
    """The call as the generator takes it; `origin`: where its span starts (spans.py)."""
    caller = caller or RolloutCaller()
    prompt = request.WhichOneof("prompt")
    return GenerateCommand(
        adapter=request.adapter,
        prompt_text=request.text if prompt == "text" else None,
        prompt_token_ids=tuple(request.token_ids.ids) if prompt == "token_ids" else None,
        sampling=sampling_request(request.sampling),
        request_id=request.request_id,
        rollout_key=caller.key,
        rollout_caller=caller.identity,
        origin=origin,
    )


def sampling_request(sampling: pb.SamplingParams) -> SamplingRequest:
    optional = {
        name: getattr(sampling, name)
        for name in OPTIONAL_SAMPLING_FIELDS
        if sampling.HasField(name)
    }
    return SamplingRequest(
        **optional,
        stop=tuple(sampling.stop),
        ignore_eos=sampling.ignore_eos,
        stop_token_ids=tuple(sampling.stop_token_ids),
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        logit_bias=dict(sampling.logit_bias),
        bad_words=tuple(sampling.bad_words),
        structured_output=_structured(sampling.structured_output)
        if sampling.HasField("structured_output")
        else None,
    )


def _structured(structured: pb.StructuredOutput) -> StructuredOutput:
    kind = structured.WhichOneof("kind")
    if kind == "json_schema":
        return StructuredOutput(json=structured.json_schema)
    if kind == "regex":
        return StructuredOutput(regex=structured.regex)
    if kind == "choice":
        return StructuredOutput(choice=tuple(structured.choice.values))
    if kind == "grammar":
        return StructuredOutput(grammar=structured.grammar)
    if kind == "json_object":
        return StructuredOutput(json_object=structured.json_object)
    # No kind set: vLLM refuses a constraint without one, naming it.
    return StructuredOutput()


def generate_response(chunk: GenerationChunk) -> pb.GenerateResponse:
    response = pb.GenerateResponse(text=chunk.text, token_ids=chunk.token_ids)
    # Runs once per token: only the first and last messages carry more than the delta.
    if chunk.request_id:
        response.adapter_name = chunk.adapter_name
        response.revision = chunk.revision
        response.request_id = chunk.request_id
    if chunk.finish_reason is not None:
        response.finish_reason = _FINISH[chunk.finish_reason]
    if chunk.usage is not None:
        response.usage.prompt_tokens = chunk.usage.prompt_tokens
        response.usage.completion_tokens = chunk.usage.completion_tokens
    if chunk.index:
        response.index = chunk.index
    if chunk.logprobs:
        response.logprobs.extend(_position(p) for p in chunk.logprobs)
    if chunk.prompt_logprobs:
        response.prompt_logprobs.extend(_position(p) for p in chunk.prompt_logprobs)
    return response


def _position(position: PositionLogprobs) -> pb.PositionLogprobs:
    message = pb.PositionLogprobs(top=[_token(t) for t in position.top])
    if position.token is not None:
        message.token.CopyFrom(_token(position.token))
    return message


def _token(token: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=token.token_id, logprob=token.logprob, rank=token.rank or 0, text=token.text
    )


def _status(status: RevisionStatus) -> pb.AdapterRevisionStatus:
    return pb.AdapterRevisionStatus(
        name=status.name,
        revision=status.revision,
        state=_STATE[status.state],
        current=status.current,
        in_flight=status.in_flight,
        lora_int_id=status.lora_int_id,
        rank=status.rank,
        last_error=status.last_error,
        tier=_TIER[status.tier],
        candidate=status.candidate,
        rollout_weight=status.rollout_weight,
    )


def _tiers(usage: TierUsage) -> pb.AdapterTiers:
    counters = usage.counters
    return pb.AdapterTiers(
        slots_in_use=usage.slots_in_use,
        slot_capacity=usage.slot_capacity,
        host_adapters=usage.host_adapters,
        host_capacity=usage.host_capacity,
        engine_adapters=usage.engine_adapters,
        disk_revisions=usage.disk.revisions,
        disk_bytes=usage.disk.bytes,
        disk_capacity_bytes=usage.disk.capacity_bytes or 0,
        routed_adapters=usage.routed_adapters,
        engine_misses=counters.engine_misses,
        disk_misses=counters.disk_misses,
        engine_evictions=counters.engine_evictions,
        disk_evictions=counters.disk_evictions,
        downloads=usage.disk.downloads,
        load_wait_seconds_p50=usage.wait_percentile(0.5),
        load_wait_seconds_p99=usage.wait_percentile(0.99),
    )

"""InferenceService over gRPC: translates proto messages to domain calls and back."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from loraserve.inference.generation import (
    FinishReason,
    GenerateCommand,
    GenerationChunk,
    SamplingRequest,
)
from loraserve.inference.registry import AdapterState, RevisionStatus
from loraserve.inference.runtime import RuntimeSlot
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name

Context = grpc.aio.ServicerContext[Any, Any]

_FINISH = {
    None: pb.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
}
_STATE = {
    AdapterState.LOADING: pb.ADAPTER_STATE_LOADING,
    AdapterState.READY: pb.ADAPTER_STATE_READY,
    AdapterState.DRAINING: pb.ADAPTER_STATE_DRAINING,
    AdapterState.FAILED: pb.ADAPTER_STATE_FAILED,
}


class InferenceServicer(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, slot: RuntimeSlot) -> None:
        self._slot = slot

    async def Generate(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.GenerateResponse]:
        runtime = self._slot.get()
        chunks = runtime.generator.generate(_command(request))
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield _response(chunk)

    async def ListAdapters(
        self, request: pb.ListAdaptersRequest, context: Context
    ) -> pb.ListAdaptersResponse:
        runtime = self._slot.get()
        return pb.ListAdaptersResponse(
            adapters=[_status(s) for s in runtime.registry.snapshot()],
            store_seq=runtime.store_seq(),
        )

    async def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: Context
    ) -> pb.GetServerInfoResponse:
        runtime = self._slot.get()
        info = runtime.engine.info
        stats = runtime.engine.stats()
        return pb.GetServerInfoResponse(
            model=info.model,
            vllm_version=info.version,
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
            loaded_adapters=runtime.registry.loaded_count(),
            replica_id=runtime.replica_id,
            store_seq=runtime.store_seq(),
        )


def register(server: grpc.aio.Server, slot: RuntimeSlot) -> None:
    pb_grpc.add_InferenceServiceServicer_to_server(InferenceServicer(slot), server)


def _command(request: pb.GenerateRequest) -> GenerateCommand:
    sampling = request.sampling
    prompt = request.WhichOneof("prompt")
    return GenerateCommand(
        adapter=request.adapter,
        prompt_text=request.text if prompt == "text" else None,
        prompt_token_ids=tuple(request.token_ids.ids) if prompt == "token_ids" else None,
        sampling=SamplingRequest(
            max_tokens=sampling.max_tokens if sampling.HasField("max_tokens") else None,
            temperature=sampling.temperature if sampling.HasField("temperature") else None,
            top_p=sampling.top_p if sampling.HasField("top_p") else None,
            top_k=sampling.top_k if sampling.HasField("top_k") else None,
            seed=sampling.seed if sampling.HasField("seed") else None,
            stop=tuple(sampling.stop),
            ignore_eos=sampling.ignore_eos,
        ),
        request_id=request.request_id,
    )


def _response(chunk: GenerationChunk) -> pb.GenerateResponse:
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
    return response


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
    )

"""Serving requests: the runtime a started server is made of, admission, per-adapter
quotas, fair turns into the engine and into its LoRA slots, generation over the engine
with an adapter lease (pulled, or pushed by the engine), and the gRPC servicer (proto
<-> domain only)."""

from loraserve.inference.serving.admission import Admission
from loraserve.inference.serving.chunks import FinishReason, GenerationChunk, Usage
from loraserve.inference.serving.fairness import FairGate, fair_gate
from loraserve.inference.serving.generation import GenerateCommand, Generator
from loraserve.inference.serving.pushed import ChunkWriter, PushedStream, pushable
from loraserve.inference.serving.quotas import QuotaGate
from loraserve.inference.serving.runtime import Runtime, RuntimeRef
from loraserve.inference.serving.servicer import (
    GENERATE_METHOD,
    GRPC_GENERATE_SPAN,
    SERVICE_NAME,
    generate_command,
    generate_response,
    register,
    rollout_caller,
)
from loraserve.inference.serving.slots import SlotGate
from loraserve.inference.serving.spans import TraceOrigin

__all__ = [
    "GENERATE_METHOD",
    "GRPC_GENERATE_SPAN",
    "SERVICE_NAME",
    "Admission",
    "ChunkWriter",
    "FairGate",
    "FinishReason",
    "GenerateCommand",
    "GenerationChunk",
    "Generator",
    "PushedStream",
    "QuotaGate",
    "Runtime",
    "RuntimeRef",
    "SlotGate",
    "TraceOrigin",
    "Usage",
    "fair_gate",
    "generate_command",
    "generate_response",
    "pushable",
    "register",
    "rollout_caller",
]

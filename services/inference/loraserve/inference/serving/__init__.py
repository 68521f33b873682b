"""Serving requests: the runtime a started server is made of, admission, per-adapter
quotas, generation over the engine with an adapter lease, and the gRPC servicer (proto
<-> domain only)."""

from loraserve.inference.serving.admission import Admission
from loraserve.inference.serving.fairness import FairGate
from loraserve.inference.serving.generation import (
    FinishReason,
    GenerateCommand,
    GenerationChunk,
    Generator,
    Usage,
)
from loraserve.inference.serving.quotas import QuotaGate
from loraserve.inference.serving.runtime import Runtime, RuntimeRef
from loraserve.inference.serving.servicer import SERVICE_NAME, register

__all__ = [
    "SERVICE_NAME",
    "Admission",
    "FairGate",
    "FinishReason",
    "GenerateCommand",
    "GenerationChunk",
    "Generator",
    "QuotaGate",
    "Runtime",
    "RuntimeRef",
    "Usage",
    "register",
]

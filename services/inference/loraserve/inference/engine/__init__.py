"""The inference engine: the `Engine` protocol and its vLLM implementation, with the
engine's arguments, sampling, logprobs, scheduler stats and the CPU build's LoRA fix
(a vLLM plugin). Nothing here knows of adapters' names, the store or the fronts."""

from loraserve.inference.engine.args import engine_args
from loraserve.inference.engine.logprobs import PositionLogprobs, TokenLogprob
from loraserve.inference.engine.protocol import (
    AdapterHandle,
    Engine,
    EngineDelta,
    EngineFinish,
    EngineInfo,
    EngineStats,
    SamplingSpec,
)
from loraserve.inference.engine.pushed import DeltaSink
from loraserve.inference.engine.pushed import supported as pushed_outputs_supported
from loraserve.inference.engine.sampling import SamplingRequest, StructuredOutput, check_limits
from loraserve.inference.engine.vllm_engine import VllmEngine

__all__ = [
    "AdapterHandle",
    "DeltaSink",
    "Engine",
    "EngineDelta",
    "EngineFinish",
    "EngineInfo",
    "EngineStats",
    "PositionLogprobs",
    "SamplingRequest",
    "SamplingSpec",
    "StructuredOutput",
    "TokenLogprob",
    "VllmEngine",
    "check_limits",
    "engine_args",
    "pushed_outputs_supported",
]

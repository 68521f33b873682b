"""What vLLM's finish reasons mean to loraserve, for pulled and pushed outputs alike."""

from __future__ import annotations

from typing import Any

from loraserve.common.errors import InvalidArgument, Unavailable
from loraserve.inference.engine.protocol import EngineFinish

# vLLM's finish reasons loraserve serves; any other ("repetition", say) ends a request
# without a finish it knows, and "error" is `failed_request`.
VLLM_FINISH = {
    "stop": EngineFinish.STOP,
    "length": EngineFinish.LENGTH,
    "abort": EngineFinish.ABORT,
}


def failed_request(request_id: str, params: Any) -> InvalidArgument | Unavailable:
    """What vLLM's "error" finish means for a request. With a structured output it is the
    grammar: one that passed vLLM's checks but that the engine could not compile or whose
    constraint no token can meet (`{"$ref": "#"}`, a regex matching nothing); asking again
    fails again, so it is the request's fault. Otherwise vLLM calls it a retryable
    internal error (a lost KV transfer, say)."""
    if params.structured_outputs is not None:
        return InvalidArgument(
            "sampling.structured_output: the engine could not generate under this "
            "constraint (it compiled, but the engine failed to compile or follow it, e.g. "
            "a schema that only refers to itself or a pattern no text matches)"
        )
    return Unavailable(f"the engine failed request {request_id} (vLLM finish 'error'); retry")

"""A request's outputs pushed into a sink by vLLM's output handler, rather than pulled
by the request's task.

In the pull path every engine step wakes each request's task (vLLM's per-request
collector sets an `asyncio.Event`), which resumes a chain of async generators to hand
one message to the transport. Pushed, the request's sink stands where that collector
was: vLLM's output handler calls `sink.put` in its one pass per engine step, and the
sink makes and writes the message right there.

The collector is not an API of vLLM (`output_processor.request_states[id].queue`), so
`supported()` checks that the installed vLLM has it where this module puts the sink, and
a test pins that to the vLLM version the project installs.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from loraserve.common.errors import InvalidArgument, Unavailable
from loraserve.inference.engine.finishes import VLLM_FINISH, failed_request
from loraserve.inference.engine.protocol import EngineFinish

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)


class DeltaSink(Protocol):
    """Where a pushed request's outputs go, called inside vLLM's output handler (which
    serves every request: neither method may raise): `delta` once per engine step with
    the step's new text and token ids, how the request finished (None: not yet, or a
    finish loraserve does not know) and whether it has; or `fail` once, with the domain
    error ending it."""

    def delta(
        self, text: str, token_ids: Sequence[int], finish: EngineFinish | None, finished: bool
    ) -> None: ...

    def fail(self, error: Exception) -> None: ...


class VllmOutputSink:
    """Stands where vLLM's per-request collector was: turns each `RequestOutput` (delta
    mode, one completion) into a delta, and an error into the domain's, as the pull path
    does (`VllmEngine.generate`)."""

    def __init__(self, sink: DeltaSink, request_id: str, params: Any) -> None:
        self._sink, self._request_id, self._params = sink, request_id, params

    def put(self, output: Any) -> None:
        try:
            self._put(output)
        except Exception as exc:
            # vLLM's output handler serves every request: an output this cannot read ends
            # this request alone.
            self._sink.fail(exc)

    def _put(self, output: Any) -> None:
        if isinstance(output, Exception):
            self._sink.fail(_domain_error(output))
            return
        completion = output.outputs[0]
        reason = completion.finish_reason
        if reason == "error":
            self._sink.fail(failed_request(self._request_id, self._params))
            return
        finish = VLLM_FINISH.get(reason) if reason is not None else None
        self._sink.delta(completion.text, completion.token_ids, finish, output.finished)


def _domain_error(exc: Exception) -> Exception:
    from vllm.exceptions import VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, EngineDeadError):
        return Unavailable("the inference engine has stopped")
    if isinstance(exc, VLLMClientError):
        return InvalidArgument(f"the engine rejected the request: {exc}")
    return exc


def supported() -> bool:
    """Whether the installed vLLM keeps a request's collector where `push` puts its sink."""
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.output_processor import RequestState
    except ImportError:
        return False
    return "queue" in inspect.signature(RequestState.__init__).parameters and hasattr(
        AsyncLLM, "add_request"
    )


async def push(
    llm: AsyncLLM,
    request_id: str,
    prompt_token_ids: Sequence[int],
    params: Any,
    lora_request: Any,
    sink: DeltaSink,
    trace_headers: Mapping[str, str] | None = None,
) -> None:
    """Adds the request to the engine with its outputs going to `sink`; what arrived while
    it was being added goes to the sink first. Raises as the pull path does for a request
    the engine refuses."""
    from vllm.exceptions import VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        collector = await llm.add_request(
            request_id,
            {"prompt_token_ids": list(prompt_token_ids)},
            params,
            lora_request=lora_request,
            trace_headers=trace_headers,
        )
    except EngineDeadError as exc:
        raise Unavailable("the inference engine has stopped") from exc
    except (VLLMClientError, ValueError) as exc:
        raise InvalidArgument(f"the engine rejected the request: {exc}") from exc
    except BaseException:
        # Cancelled while adding: the engine may hold the request already.
        await asyncio.shield(llm.abort(request_id))
        raise
    # From here on vLLM hands the request's outputs to the sink. Whatever came while
    # add_request awaited waits in vLLM's own collector (all of it, if the request has
    # already ended and left the output processor).
    outputs = VllmOutputSink(sink, request_id, params)
    state = llm.output_processor.request_states.get(collector.request_id)
    if state is not None:
        state.queue = outputs
    try:
        early = collector.get_nowait()
    except Exception as exc:
        early = exc
    if early is not None:
        outputs.put(early)
    ended = isinstance(early, Exception) or getattr(early, "finished", False)
    if state is None and not ended:
        sink.fail(Unavailable(f"the engine lost request {request_id}; retry"))

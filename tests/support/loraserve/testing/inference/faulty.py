"""`python -m loraserve.testing.inference.faulty serve ...`: the real `inference serve`,
whose vLLM engine fails every request of the LoRA names listed in
`LORASERVE_TEST_FAILING_LORAS` (comma-separated `NAME@REV`, the engine's LoRA names).

The failure is the one vLLM itself reports for a request it could not run: its
output ends with finish reason "error". Everything after that is the server's own
path (the Generate call fails, the failure is counted against the revision that
served it and reported to the store), so a test can make one revision of an adapter
fail on real replicas while every other revision serves normally.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from loraserve.inference.engine.finishes import failed_request

FAILING_ENV = "LORASERVE_TEST_FAILING_LORAS"


def fail_loras(failing: frozenset[str]) -> None:
    """Makes vLLM's AsyncLLM end every request of a LoRA named in `failing` in error,
    whether its outputs are pulled (`AsyncLLM.generate`) or pushed."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from loraserve.inference.engine import pushed

    generate = AsyncLLM.generate

    async def failing_generate(self: AsyncLLM, *args: Any, **kwargs: Any) -> AsyncGenerator[Any]:
        lora = kwargs.get("lora_request")
        fails = lora is not None and lora.lora_name in failing
        async for output in generate(self, *args, **kwargs):
            if fails:
                _fail(output)
            yield output

    AsyncLLM.generate = failing_generate
    push = pushed.push

    async def failing_push(
        llm: AsyncLLM,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: Any,
        lora_request: Any,
        sink: pushed.DeltaSink,
        trace_headers: Mapping[str, str] | None = None,
    ) -> None:
        if lora_request is not None and lora_request.lora_name in failing:
            sink = _Failing(sink, request_id, params)
        await push(llm, request_id, prompt_token_ids, params, lora_request, sink, trace_headers)

    pushed.push = failing_push


class _Failing:
    """A pushed request's sink to which every output arrives as vLLM's "error" finish
    (the one `VllmOutputSink` turns into `failed_request`)."""

    def __init__(self, sink: Any, request_id: str, params: Any) -> None:
        self._sink, self._request_id, self._params = sink, request_id, params

    def delta(self, *_: Any) -> None:
        self._sink.fail(failed_request(self._request_id, self._params))

    def fail(self, error: Exception) -> None:
        self._sink.fail(error)


def _fail(output: Any) -> None:
    for completion in output.outputs:
        completion.finish_reason = "error"


def main() -> None:
    failing = frozenset(name for name in os.environ.get(FAILING_ENV, "").split(",") if name)
    fail_loras(failing)
    from loraserve.inference.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()

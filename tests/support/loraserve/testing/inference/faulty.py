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
from collections.abc import AsyncGenerator
from typing import Any

FAILING_ENV = "LORASERVE_TEST_FAILING_LORAS"


def fail_loras(failing: frozenset[str]) -> None:
    """Makes vLLM's AsyncLLM end every request of a LoRA named in `failing` in error."""
    from vllm.v1.engine.async_llm import AsyncLLM

    generate = AsyncLLM.generate

    async def failing_generate(self: AsyncLLM, *args: Any, **kwargs: Any) -> AsyncGenerator[Any]:
        lora = kwargs.get("lora_request")
        fails = lora is not None and lora.lora_name in failing
        async for output in generate(self, *args, **kwargs):
            if fails:
                for completion in output.outputs:
                    completion.finish_reason = "error"
            yield output

    AsyncLLM.generate = failing_generate


def main() -> None:
    failing = frozenset(name for name in os.environ.get(FAILING_ENV, "").split(",") if name)
    fail_loras(failing)
    from loraserve.inference.__main__ import main as serve

    serve()


if __name__ == "__main__":
    main()

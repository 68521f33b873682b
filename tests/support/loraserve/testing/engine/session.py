"""One real vLLM engine (v1 `AsyncLLM`, CPU build in tests) on the tiny model, per session.

Starting the engine takes about 20 s on a CPU, so every test that needs it shares
this one; tests must leave it as they found it (remove the adapters they add) and be
marked `@pytest.mark.engine`.

vLLM's CPU platform always starts the engine core with multiprocessing `spawn`. The
child re-imports the parent's `__main__` under the name `__mp_main__`; for `pytest`
and `python -m pytest` that module guards its entry point with
`if __name__ == "__main__"`, so the child does not run the test session again.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest

from loraserve.testing.engine.starts import engine_starting
from loraserve.testing.engine.work import count_work

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

# Limits the session engine is started with, for tests that probe them.
MAX_LORAS: Final = 4
MAX_LORA_RANK: Final = 16
MAX_CPU_LORAS: Final = 8
MAX_MODEL_LEN: Final = 512

# The environment of every engine a test starts, here or in a server process:
# - GiB of KV cache: vLLM's CPU default takes a large share of the machine's memory.
# - Threads left unpinned, one per engine: vLLM's CPU build pins each engine worker to
#   one core and keeps the rest for other work (`auto`), the same core for every engine
#   on the machine. A test session runs up to six engines at once on two cores; pinned,
#   they all queued on that one core while the other waited.
ENGINE_ENV: Final = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture(scope="session")
async def vllm_engine(tiny_model_dir: Path) -> AsyncIterator[AsyncLLM]:
    """The session's vLLM `AsyncLLM` with LoRA enabled, serving `tiny_model_dir` in fp32."""
    from vllm.v1.engine.async_llm import AsyncLLM

    from loraserve.inference.engine import engine_args
    from loraserve.inference.settings import EngineOptions

    for name, value in ENGINE_ENV.items():
        os.environ.setdefault(name, value)
    # Built with the server's own engine-argument code, so the tests exercise it.
    args = engine_args(
        EngineOptions(
            model=str(tiny_model_dir),
            max_loras=MAX_LORAS,
            max_lora_rank=MAX_LORA_RANK,
            max_cpu_loras=MAX_CPU_LORAS,
            max_model_len=MAX_MODEL_LEN,
            dtype="float32",
            # Nothing to gain from graph compilation for a model this small; it only
            # slows start-up.
            extra={"enforce_eager": True, "seed": 0},
        )
    )
    started = time.monotonic()
    async with engine_starting():
        # Built inside the session's event loop: AsyncLLM binds its output handler to it.
        engine = AsyncLLM.from_engine_args(args)
    count_work(engine)
    log.info("vllm_engine.started seconds=%.1f", time.monotonic() - started)
    try:
        yield engine
    finally:
        engine.shutdown()
        # Shutting down leaves a traceback that keeps this frame alive until exit, when
        # AsyncLLM.__del__ would shut down again among half-unloaded modules and print
        # a TypeError; dropping the reference lets the engine go now.
        del engine


# A chat template for the tiny model, which has none: role-prefixed lines after BOS, so a
# chat's prompt is the completion prompt `PLAIN_CHAT_TEMPLATE` renders.
PLAIN_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def plain_chat_prompt(messages: list[dict[str, str]]) -> str:
    """What `PLAIN_CHAT_TEMPLATE` renders for `messages`, less the BOS it starts with."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


@contextmanager
def chat_template(engine: AsyncLLM, template: str | None) -> Iterator[None]:
    """The session engine's tokenizer with `template` as its chat template until the
    block ends (the engine is shared: the tiny model's own, none, comes back)."""
    tokenizer: Any = engine.get_tokenizer()
    before = getattr(tokenizer, "chat_template", None)
    tokenizer.chat_template = template
    try:
        yield
    finally:
        tokenizer.chat_template = before

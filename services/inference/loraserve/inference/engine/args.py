"""The vLLM engine arguments our settings make, and building the engine from them.

Our own flags always set their engine arguments: the `--engine-arg` passthrough
may add any other argument vLLM has, and a key vLLM lacks or that a flag of ours
manages is InvalidArgument before anything is started.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loraserve.common.errors import InvalidArgument
from loraserve.inference.engine.lora_preload import WORKER_EXTENSION

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from loraserve.inference.settings import EngineOptions

# Flags of our own that map onto engine arguments; the passthrough may not override them.
MANAGED_ENGINE_ARGS = frozenset(
    {
        "model",
        "enable_lora",
        "max_loras",
        "max_lora_rank",
        "max_cpu_loras",
        "gpu_memory_utilization",
        "max_model_len",
        "dtype",
        "lora_dtype",
        "cpu_offload_gb",
        "disable_log_stats",
    }
)
# Set by loraserve itself, with no flag: the worker extension that reads adapters off the
# engine's step loop (lora_preload).
INTERNAL_ENGINE_ARGS = frozenset({"worker_extension_cls"})


def build_async_llm(options: EngineOptions) -> AsyncLLM:
    """Builds (and starts) the engine; blocks for as long as loading the model takes."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(engine_args(options))


def engine_args(options: EngineOptions) -> Any:
    """vLLM `AsyncEngineArgs` for the settings, with the passthrough applied."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    check_passthrough(options.extra)
    kwargs: dict[str, Any] = {
        "model": options.model,
        "enable_lora": True,
        "max_loras": options.max_loras,
        "max_lora_rank": options.max_lora_rank,
        "max_cpu_loras": options.max_cpu_loras,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "dtype": options.dtype,
        "lora_dtype": options.lora_dtype,
        "cpu_offload_gb": options.cpu_offload_gb,
        # Scheduler stats (running/waiting, KV-cache use) only flow with stats on.
        "disable_log_stats": False,
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if options.max_model_len is not None:
        kwargs["max_model_len"] = options.max_model_len
    kwargs.update(options.extra)
    return AsyncEngineArgs(**kwargs)


def check_passthrough(extra: Mapping[str, object]) -> None:
    """Raises InvalidArgument for a passthrough key vLLM does not have or we manage."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for key in extra:
        if key in INTERNAL_ENGINE_ARGS:
            raise InvalidArgument(
                f"--engine-arg {key} is set by loraserve (its adapter preloader) and cannot "
                "be changed"
            )
        if key in MANAGED_ENGINE_ARGS:
            raise InvalidArgument(
                f"--engine-arg {key} is set by its own flag (--{key.replace('_', '-')})"
            )
        if key not in known:
            raise InvalidArgument(f"--engine-arg {key}: vLLM has no engine argument {key!r}")

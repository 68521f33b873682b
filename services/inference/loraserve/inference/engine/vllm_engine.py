"""`VllmEngine`: the `Engine` over vLLM's `AsyncLLM`, on CPU and GPU builds alike
(`args` builds it from the settings); the only place that drives vLLM."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import weakref
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from loraserve.common.errors import FailedPrecondition, InvalidArgument, Unavailable

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from loraserve.inference.settings import EngineOptions

from loraserve.inference.engine import lora_preload, pushed
from loraserve.inference.engine.args import build_async_llm
from loraserve.inference.engine.finishes import VLLM_FINISH, failed_request
from loraserve.inference.engine.logprobs import PositionLogprobs, vllm_logprobs
from loraserve.inference.engine.protocol import (
    AdapterHandle,
    EngineDelta,
    EngineInfo,
    EngineStats,
    SamplingSpec,
)
from loraserve.inference.engine.sampling import (
    SamplingRequest,
    ServerDefaults,
    resolve_max_tokens,
    verify_for_model,
    vllm_sampling_params,
)
from loraserve.inference.engine.stats import SchedulerTap

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Texts this long are tokenized on the tokenizer thread, so the event loop keeps serving.
_INLINE_TOKENIZE_CHARS = 2048
# How often an adapter load asks the workers to add it once they have read its weights:
# each ask waits for the engine's current step to end, so this only bounds the idle case.
_PRELOAD_POLL_S = 0.01


# vLLM leaves lora_int_id uniqueness to the caller. One allocator per AsyncLLM, not per
# wrapper, so that every wrapper of a shared engine (tests share one) draws distinct ids.
_id_counters: weakref.WeakKeyDictionary[object, itertools.count[int]] = weakref.WeakKeyDictionary()
_id_lock = threading.Lock()


def _next_lora_id(llm: object) -> int:
    with _id_lock:
        counter = _id_counters.setdefault(llm, itertools.count(1))
        return next(counter)


# One tokenizer thread per AsyncLLM too: every wrapper of a shared engine queues there.
_tokenizer_threads: weakref.WeakKeyDictionary[object, ThreadPoolExecutor] = (
    weakref.WeakKeyDictionary()
)


def _tokenizer_thread(llm: object) -> ThreadPoolExecutor:
    with _id_lock:
        return _tokenizer_threads.setdefault(
            llm, ThreadPoolExecutor(1, thread_name_prefix="tokenizer")
        )


class VllmEngine:
    """`Engine` over a vLLM v1 `AsyncLLM` built with LoRA enabled."""

    def __init__(self, llm: AsyncLLM) -> None:
        import vllm
        from vllm.platforms import current_platform

        if llm.vllm_config.lora_config is None:
            raise FailedPrecondition("the vLLM engine was started without enable_lora")
        self._llm = llm
        self._tokenizer = llm.get_tokenizer()
        model = llm.model_config
        lora = llm.vllm_config.lora_config
        cache = llm.vllm_config.cache_config
        self._info = EngineInfo(
            model=model.model,
            version=vllm.__version__,
            device=current_platform.device_type,
            max_model_len=model.max_model_len,
            vocab_size=model.get_vocab_size(),
            max_loras=lora.max_loras,
            max_lora_rank=lora.max_lora_rank,
            max_cpu_loras=lora.max_cpu_loras or lora.max_loras,
            dtype=str(model.dtype).removeprefix("torch."),
            lora_dtype=str(lora.lora_dtype).removeprefix("torch."),
            gpu_memory_utilization=cache.gpu_memory_utilization,
            max_num_seqs=llm.vllm_config.scheduler_config.max_num_seqs,
        )
        self._defaults = ServerDefaults.of_model(model)
        from vllm.renderers.params import TokenizeParams

        self._prompt_limits = TokenizeParams(
            max_total_tokens=model.max_model_len, max_total_tokens_param="max_model_len"
        )
        self._template_limits = TokenizeParams(
            max_total_tokens=model.max_model_len,
            max_total_tokens_param="max_model_len",
            add_special_tokens=False,
        )
        self._tokenizer_thread = _tokenizer_thread(llm)
        # vLLM traces only with its own `otlp_traces_endpoint` (else it warns of headers).
        self._traced = llm.observability_config.otlp_traces_endpoint is not None
        self._tap = SchedulerTap()
        # vLLM has no public hook to read scheduler stats from an engine that already
        # exists; its stat-logger manager is where they arrive, so listen there.
        manager = getattr(llm, "logger_manager", None)
        if manager is not None:
            manager.stat_loggers.append(self._tap)
        else:
            log.warning(
                "engine.stats_unavailable: vLLM log_stats is off; running/waiting are "
                "approximated and KV-cache use reads 0"
            )

    @classmethod
    async def start(cls, options: EngineOptions) -> VllmEngine:
        """Builds and starts an engine from settings (the slow part: loading the model)."""
        log.info("engine.starting model=%s", options.model)
        # Importing vLLM and building the engine block for many seconds; in a thread,
        # the event loop keeps answering health checks meanwhile. Built there, AsyncLLM
        # starts its output handler on this loop at the first request.
        llm = await asyncio.to_thread(build_async_llm, options)
        engine = cls(llm)
        log.info("engine.started model=%s device=%s", options.model, engine.info.device)
        return engine

    @property
    def info(self) -> EngineInfo:
        return self._info

    def new_lora_id(self) -> int:
        return _next_lora_id(self._llm)

    async def prompt_ids(self, text: str) -> list[int]:
        if len(text) > _INLINE_TOKENIZE_CHARS:
            return await self._on_tokenizer_thread(self._encode, text, self._prompt_limits)
        return self._encode(text, self._prompt_limits)

    async def _on_tokenizer_thread(self, work: Callable[..., _T], *args: Any) -> _T:
        """`work` on the engine's one tokenizer thread: off the event loop, and one long
        text at a time, so concurrent long prompts never hold several tokenizations'
        buffers at once (nor spread them over a thread pool's malloc arenas)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenizer_thread, work, *args)

    def _encode(self, text: str, limits: Any) -> list[int]:
        """vLLM's own bounds for a text prompt (`TokenizeParams`, as its OpenAI server):
        a text longer than the context's tokens times the longest token in the vocabulary
        cannot fit and is refused unread; any other is tokenized up to one token past the
        context, so an overlong prompt costs no more than a full one."""
        from vllm.exceptions import VLLMValidationError

        try:
            limits.apply_pre_tokenization(self._tokenizer, {"prompt": text})
            ids = self._tokenizer.encode(text, **limits.get_encode_kwargs())
            limits.apply_post_tokenization(self._tokenizer, {"prompt_token_ids": ids})
        except VLLMValidationError as exc:
            raise InvalidArgument(f"prompt: {exc}") from exc
        return list(ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids)))

    def sampling(self, request: SamplingRequest, prompt_tokens: int) -> SamplingSpec:
        max_tokens = resolve_max_tokens(
            request.max_tokens, prompt_tokens, self._info.max_model_len, self._defaults
        )
        params = vllm_sampling_params(request, max_tokens, self._defaults)
        verify_for_model(params, self._llm.vllm_config, self._tokenizer)
        return SamplingSpec(max_tokens=max_tokens, n=params.n, params=params)

    async def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int] | None:
        """The model's chat template over `messages`, assistant turn opened; None if none."""
        if not getattr(self._tokenizer, "chat_template", None):
            return None
        if sum(len(m["content"]) for m in messages) > _INLINE_TOKENIZE_CHARS:
            return await self._on_tokenizer_thread(self._chat_prompt_ids, messages)
        return self._chat_prompt_ids(messages)

    def _chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        from jinja2 import TemplateError

        template = getattr(self._tokenizer, "chat_template", None)

        try:
            text = self._tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                chat_template=template,
                tokenize=False,
                add_generation_prompt=True,
            )
        except TemplateError as exc:
            raise InvalidArgument(f"the model's chat template rejects the messages: {exc}") from exc
        # The template writes the special tokens (BOS) itself; encoding must not add more.
        return self._encode(str(text), self._template_limits)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        params = sampling.params
        stream = self._llm.generate(
            {"prompt_token_ids": list(prompt_token_ids)},
            params,
            request_id,
            lora_request=_lora_request(adapter) if adapter else None,
            trace_headers=trace_headers if self._traced else None,
        )
        finished = False
        started = False
        try:
            async with contextlib.aclosing(stream):
                async for output in stream:
                    prompt_logprobs = (
                        vllm_logprobs(
                            prompt_token_ids, output.prompt_logprobs, params.prompt_logprobs
                        )
                        if not started and output.prompt_logprobs is not None
                        else ()
                    )
                    started = True
                    finished = output.finished
                    # A loop here, not a helper generator: this runs once per token.
                    for completion in output.outputs:
                        if completion.finish_reason == "error":
                            raise failed_request(request_id, params)
                        yield _delta(completion, params.logprobs, prompt_logprobs)
                        prompt_logprobs = ()
        except EngineDeadError as exc:
            raise Unavailable("the inference engine has stopped") from exc
        except VLLMClientError as exc:
            raise InvalidArgument(f"the engine rejected the request: {exc}") from exc
        except ValueError as exc:
            # vLLM checks a request (structured output, logprobs, token ids) when it is
            # added, and raises ValueError: before any output, that is the request's fault.
            if started:
                raise
            raise InvalidArgument(f"the engine rejected the request: {exc}") from exc
        finally:
            if not finished:
                # Closing vLLM's generator aborts too; this also covers an exit between
                # steps, when no await inside vLLM is pending to receive the cancel.
                await asyncio.shield(self._llm.abort(request_id))

    async def push(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        sink: pushed.DeltaSink,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> None:
        """Adds a request whose outputs vLLM's output handler puts into `sink` (see
        `pushed`); `abort(request_id)` ends it."""
        lora_request = _lora_request(adapter) if adapter else None
        headers = trace_headers if self._traced else None
        await pushed.push(
            self._llm, request_id, prompt_token_ids, sampling.params, lora_request, sink, headers
        )

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    def tune_for_serving(self, serving: bool = True) -> None:
        """Once the service serves: `vllm.envs` caches what it reads (vLLM does so in its
        engine and worker processes; in this one its stats read an environment variable
        through `os.environ` for every output), and vLLM's Prometheus stat logger goes,
        since its registry is served nowhere (the service's /metrics serve their own, and
        the scheduler's figures come from this engine's tap). Not before: vLLM sets some
        of its variables while the engine starts. `serving=False`, once the service has
        stopped, reads the environment afresh again (for an engine started after it)."""
        import vllm.envs
        from vllm.v1.metrics.loggers import PrometheusStatLogger

        if not serving:
            vllm.envs.disable_envs_cache()
            return
        vllm.envs.enable_envs_cache()
        manager = getattr(self._llm, "logger_manager", None)
        if manager is not None:
            manager.stat_loggers = [
                logger
                for logger in manager.stat_loggers
                if not isinstance(logger, PrometheusStatLogger)
            ]

    async def add_lora(self, adapter: AdapterHandle) -> None:
        # Not vLLM's add_lora: the workers first read the weights off their step loop,
        # then add them (see lora_preload).
        try:
            added = await self._add_preloaded(adapter)
        except Exception as exc:
            raise FailedPrecondition(
                f"the engine could not load adapter {adapter.lora_name}: {exc}"
            ) from exc
        if not all(added):
            raise FailedPrecondition(f"the engine did not load adapter {adapter.lora_name}")

    async def _add_preloaded(self, adapter: AdapterHandle) -> list[bool]:
        args = (adapter.lora_name, adapter.lora_int_id, adapter.path)
        await self._llm.collective_rpc(lora_preload.PRELOAD, args=args)
        while True:
            added = await self._llm.collective_rpc(lora_preload.ADD_PRELOADED, args=args)
            if None not in added:
                return list(added)
            await asyncio.sleep(_PRELOAD_POLL_S)

    async def preload_counts(self) -> dict[str, int]:
        """Adapter loads the workers served from a preload, and those vLLM did on its
        step loop, summed over the workers."""
        counts: dict[str, int] = {}
        for worker in await self._llm.collective_rpc(lora_preload.COUNTS):
            for key, value in worker.items():
                counts[key] = counts.get(key, 0) + value
        return counts

    async def remove_lora(self, lora_int_id: int) -> None:
        await self._llm.remove_lora(lora_int_id)

    async def list_loras(self) -> set[int]:
        return set(await self._llm.list_loras())

    def stats(self) -> EngineStats:
        # The frontend's count of unfinished requests is exact and immediate; the
        # scheduler's split arrives only with the next engine step, so after the last
        # request ends it may still show it. Clamp the split to the exact total.
        unfinished = self._llm.get_num_unfinished_requests()
        if not self._tap.seen:
            return EngineStats(running=unfinished, waiting=0, kv_cache_usage=0.0)
        running = min(self._tap.running, unfinished)
        waiting = min(self._tap.waiting, unfinished - running)
        if not unfinished:
            return EngineStats(running=0, waiting=0, kv_cache_usage=0.0)
        return EngineStats(
            running=running,
            waiting=waiting,
            kv_cache_usage=self._tap.kv_cache_usage,
            running_adapters=self._tap.running_adapters,
            waiting_adapters=self._tap.waiting_adapters,
        )

    def shutdown(self) -> None:
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)
        self._llm.shutdown()


def _delta(
    completion: Any, logprobs: int | None, prompt_logprobs: tuple[PositionLogprobs, ...]
) -> EngineDelta:
    """One completion of a vLLM RequestOutput as a delta."""
    finish = completion.finish_reason
    return EngineDelta(
        completion.text,
        tuple(completion.token_ids),
        VLLM_FINISH.get(finish) if finish is not None else None,
        completion.index,
        vllm_logprobs(completion.token_ids, completion.logprobs, logprobs)
        if completion.logprobs is not None
        else (),
        prompt_logprobs,
    )


def _lora_request(adapter: AdapterHandle) -> Any:
    from vllm.lora.request import LoRARequest

    # Never load_inplace: every revision has its own id, so old and new coexist.
    return LoRARequest(
        lora_name=adapter.lora_name, lora_int_id=adapter.lora_int_id, lora_path=adapter.path
    )

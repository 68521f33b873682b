"""Whether an adapter revision can run on this engine and model.

Checked before the engine sees the adapter, so an incompatible push is refused with
a reason a person can act on (FAILED_PRECONDITION) instead of a vLLM stack trace.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from loraserve.common.errors import FailedPrecondition, InvalidArgument
from loraserve.common.revisions.lora_values import check_config_scale, check_weights_file
from loraserve.common.revisions.manifest import Revision
from loraserve.common.revisions.peft_format import (
    CONFIG_FILE,
    RANK_AXIS,
    WEIGHTS_FILE,
    linear_weight_shapes,
    lora_shape,
    lora_tensor_name,
    matrix_shapes,
)

log = logging.getLogger(__name__)

# Used only when the model's weights cannot be read (e.g. a hub id instead of a path).
LLAMA_TARGET_MODULES = frozenset(
    {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
)
# Linear layers with weights that vLLM does not wrap with LoRA layers.
_NOT_LORA_TARGETS = frozenset({"embed_tokens", "lm_head", "wte", "wpe", "embed_in", "embed_out"})
_EMPTY_STORE_RANK = 16


def supported_lora_ranks() -> tuple[int, ...]:
    """The max_lora_rank values vLLM accepts, ascending."""
    from vllm.config.lora import MaxLoRARanks

    return tuple(sorted(typing.get_args(MaxLoRARanks)))


def smallest_covering_rank(ranks: Iterable[int], supported: Iterable[int]) -> int:
    """The smallest supported max_lora_rank that is at least every rank in `ranks`.

    With no ranks at all (an empty store), vLLM's default of 16, so the engine can
    take typical adapters pushed later.
    """
    options = sorted(supported)
    wanted = max(ranks, default=_EMPTY_STORE_RANK)
    for option in options:
        if option >= wanted:
            return option
    raise InvalidArgument(
        f"an adapter has LoRA rank {wanted}, above the largest rank vLLM supports "
        f"({options[-1]}); remove it or serve it elsewhere"
    )


def model_lora_targets(model_dir: Path) -> frozenset[str]:
    """Module names an adapter may target, read from the model's safetensors headers:
    the last part of every layer `model_lora_shapes` finds; Llama's for a model that is
    not a local directory (a hub name)."""
    if not any(model_dir.glob("*.safetensors")):
        log.warning("compat.model_weights_unreadable model=%s: assuming Llama modules", model_dir)
        return LLAMA_TARGET_MODULES
    return frozenset(path.rpartition(".")[2] for path in model_lora_shapes(model_dir))


def model_lora_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of every LoRA-targetable linear layer, by module path
    (e.g. `model.layers.0.self_attn.q_proj`), read from the model's safetensors headers
    (none for a model that is not a local directory).
    Every 2-D `<module path>.weight` is a linear layer or an embedding; the linear ones
    are what vLLM applies LoRA to."""
    return {
        path: shape
        for path, shape in linear_weight_shapes(model_dir).items()
        if path.rpartition(".")[2] not in _NOT_LORA_TARGETS
    }


@dataclass(frozen=True)
class AdapterFacts:
    """What compatibility depends on, from a revision's manifest."""

    name: str
    revision: int
    rank: int
    target_modules: tuple[str, ...]
    base_model: str


class CompatibilityChecker:
    """Decides whether adapters fit the served model and the engine's LoRA limits."""

    def __init__(
        self,
        *,
        max_lora_rank: int,
        target_modules: frozenset[str],
        served_model_name: str,
        require_base_model_match: bool = True,
        module_shapes: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self._module_shapes = dict(module_shapes or {})
        self._max_lora_rank = max_lora_rank
        self._target_modules = target_modules
        self._served_model = _basename(served_model_name)
        self._require_base_match = require_base_model_match

    def check_manifest(self, manifest: Revision) -> None:
        """Raises FailedPrecondition naming the first reason the revision cannot be
        served, judged from its manifest alone (before any byte is downloaded)."""
        self.check(manifest_facts(manifest))

    def check(self, facts: AdapterFacts) -> None:
        """Raises FailedPrecondition naming the first reason `facts` cannot be served."""
        what = f"adapter {facts.name}@{facts.revision}"
        if facts.rank < 1:
            raise FailedPrecondition(f"{what} has LoRA rank {facts.rank}; it must be at least 1")
        if facts.rank > self._max_lora_rank:
            raise FailedPrecondition(
                f"{what} has LoRA rank {facts.rank}, above this engine's max_lora_rank "
                f"{self._max_lora_rank}; restart with --max-lora-rank >= {facts.rank} or auto"
            )
        unsupported = sorted(set(facts.target_modules) - self._target_modules)
        if unsupported:
            raise FailedPrecondition(
                f"{what} targets modules {unsupported} that the served model does not have; "
                f"it has {sorted(self._target_modules)}"
            )
        if not serves_base_model(
            facts.base_model, self._served_model, require_match=self._require_base_match
        ):
            raise FailedPrecondition(
                f"{what} was trained on base model {facts.base_model!r}, but this server "
                f"serves {self._served_model!r} (--allow-base-model-mismatch to load it anyway)"
            )

    def check_weights(self, name: str, revision: int, adapter_dir: Path) -> None:
        """Raises FailedPrecondition if a LoRA tensor's shape does not fit the layer it
        adapts, a weight is NaN or infinite, or the LoRA scale is out of bounds.
        Blocking: reads both files whole.

        vLLM copies LoRA weights into fixed-size slots without checking, so a narrower
        tensor would load and silently compute garbage; layers the model's checkpoint
        does not name are left to vLLM to judge. The store refuses the values at push,
        but files can reach a bucket around it, so they are checked again here, on the
        bytes vLLM is about to read (`loraserve.common.revisions.lora_values`)."""
        self._check_shapes(name, revision, adapter_dir)
        try:
            check_config_scale((adapter_dir / CONFIG_FILE).read_bytes())
            check_weights_file(adapter_dir / WEIGHTS_FILE)
        except InvalidArgument as exc:
            raise FailedPrecondition(f"adapter {name}@{revision}: {exc.message}") from None

    def _check_shapes(self, name: str, revision: int, adapter_dir: Path) -> None:
        if not self._module_shapes:
            return
        shapes = matrix_shapes(adapter_dir / WEIGHTS_FILE)
        for tensor, shape in sorted(shapes.items()):
            lora = lora_tensor_name(tensor)
            layer = self._module_shapes.get(lora.module) if lora else None
            if lora is None or layer is None:
                continue
            expected = lora_shape(lora.side, shape[RANK_AXIS[lora.side]], layer)
            if shape != expected:
                raise FailedPrecondition(
                    f"adapter {name}@{revision}: tensor {tensor} has shape {list(shape)}, but "
                    f"layer {lora.module} of the served model is {layer[0]}x{layer[1]} "
                    f"(out x in), so lora_{lora.side} must be {list(expected)}"
                )


def serves_base_model(adapter_base: str, served_model_name: str, *, require_match: bool) -> bool:
    """Whether an adapter trained on `adapter_base` (`base_model_name_or_path`, often a
    path or hub id) may run on the model served as `served_model_name`: their last
    path parts match, the adapter names none, or matching is not required."""
    base = _basename(adapter_base)
    return not require_match or not base or base == _basename(served_model_name)


def _basename(model: str) -> str:
    return model.rstrip("/").rsplit("/", 1)[-1]


def manifest_facts(manifest: Revision) -> AdapterFacts:
    """What the compatibility checks need of a manifest."""
    return AdapterFacts(
        manifest.adapter_name,
        manifest.revision,
        manifest.rank,
        manifest.target_modules,
        manifest.base_model,
    )

"""Adapter revisions on this replica: which are in the engine, where each name routes,
whether a revision can run here (compatibility), and the residency tiers. Make-before-
break hot swap and load on miss live here; files come from `cache`, orders from `sync`."""

from loraserve.inference.adapters.compat import (
    LLAMA_TARGET_MODULES,
    AdapterFacts,
    CompatibilityChecker,
    model_lora_shapes,
    model_lora_targets,
    serves_base_model,
    smallest_covering_rank,
    supported_lora_ranks,
)
from loraserve.inference.adapters.ports import RegistryObserver, RevisionCache
from loraserve.inference.adapters.registry import AdapterRegistry, Lease
from loraserve.inference.adapters.registry_reads import RegistryCounts
from loraserve.inference.adapters.rollouts import (
    ROLLOUT_KEY_HEADER,
    RolloutCaller,
    RolloutKeys,
    peer_host,
)
from loraserve.inference.adapters.state import RevisionLife, RevisionStatus
from loraserve.inference.adapters.tiers import Tier, TierCounters, TierUsage, TierView

__all__ = [
    "LLAMA_TARGET_MODULES",
    "ROLLOUT_KEY_HEADER",
    "AdapterFacts",
    "AdapterRegistry",
    "CompatibilityChecker",
    "Lease",
    "RegistryCounts",
    "RegistryObserver",
    "RevisionCache",
    "RevisionLife",
    "RevisionStatus",
    "RolloutCaller",
    "RolloutKeys",
    "Tier",
    "TierCounters",
    "TierUsage",
    "TierView",
    "model_lora_shapes",
    "model_lora_targets",
    "peer_host",
    "serves_base_model",
    "smallest_covering_rank",
    "supported_lora_ranks",
]

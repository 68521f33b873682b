"""Fair admission's settings (inference `serve`): the order requests go into a
saturated engine, how many go in at once, the least number of places kept from
adapters sending above their fair rate, each adapter's weight, and the order adapters
take LoRA slots in. The gates themselves are loraserve.inference.serving.fairness and
.slots."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from loraserve.common.config.flags import non_negative_int, positive_int

# At least two places: even when the other adapters are expected to need none, two of
# their requests may come at once during a flood without waiting. It binds only adapters
# sending above 1.5x their fair rate, so it costs nothing while no adapter does.
DEFAULT_HEADROOM = 2


@dataclass(frozen=True)
class AdmissionOptions:
    """How requests go into the engine once it is saturated (serving.fairness)."""

    # Round-robin across adapters (weighted); False: first come first served (vLLM's).
    fair: bool = True
    # Requests in the engine at once; None: the engine's max_num_seqs (one batch).
    max_engine_requests: int | None = None
    # The least number of engine places kept from adapters sending above their fair rate
    # (more when the others are expected to need more); 0: none kept.
    headroom: int = DEFAULT_HEADROOM
    # Adapter name -> its share of turns; an adapter not named has weight 1.
    weights: Mapping[str, float] = field(default_factory=dict)
    # LoRA slots handed out in the order adapters ask, one drained for an adapter
    # waiting (serving.slots); False: vLLM's own order (resident adapters' requests
    # first, another adapter waits until a slot runs dry). Off by default: it cut
    # benchmark 10's affinity tail, and cost round robin a fifth of its tokens/s.
    slot_turns: bool = False


def parse_weights(text: str) -> dict[str, float]:
    """`NAME=WEIGHT,...` (weights positive numbers) for `--adapter-weights`."""
    weights: dict[str, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            weight = float(value) if sep and name else 0.0
        except ValueError:
            weight = 0.0
        if not weight > 0:
            raise argparse.ArgumentTypeError(
                f"adapter weight {item!r}: give NAME=WEIGHT with a positive number"
            )
        weights[name.strip()] = weight
    return weights


def add_admission_flags(flag: Callable[..., None]) -> None:
    """The fair admission flags, for a service's parser (`EnvFlags.add` bound to it)."""
    flag(
        "admission-order",
        "once the engine is saturated, admit waiting requests round-robin across "
        "adapters (fair) or first come first served (fifo)",
        "fair",
        choices=("fair", "fifo"),
    )
    flag(
        "max-engine-requests",
        "sequences in the engine at once (a request takes its n), the rest wait for "
        "their turn (default: the engine's max_num_seqs)",
        type=positive_int,
    )
    flag(
        "fair-headroom",
        "the least number of engine places kept from an adapter sending above 1.5x its "
        "fair rate over the last seconds (a flood); more are kept when the other "
        "adapters are expected to need more, but never its share: as many as the busiest "
        "other adapter holds, at least one (0: none kept, plain round-robin; at most "
        "max-engine-requests - 1)",
        str(DEFAULT_HEADROOM),
        type=non_negative_int,
    )
    flag(
        "adapter-weights",
        "fair admission's share of turns per adapter, NAME=WEIGHT comma-separated (others 1)",
        "",
        type=parse_weights,
    )
    flag(
        "lora-slot-order",
        "how adapters take the engine's LoRA slots (--max-loras): turns (in the order "
        "they ask; for an adapter waiting, the one with the fewest requests in the "
        "engine stops taking new ones and gives its slot up) or engine (vLLM's own: "
        "adapters in a slot take every new request of theirs, another waits until one "
        "runs dry; the default)",
        "engine",
        choices=("turns", "engine"),
    )


def admission_from_args(args: argparse.Namespace) -> AdmissionOptions:
    return AdmissionOptions(
        fair=args.admission_order == "fair",
        max_engine_requests=args.max_engine_requests,
        headroom=args.fair_headroom,
        weights=args.adapter_weights,
        slot_turns=args.lora_slot_order == "turns",
    )

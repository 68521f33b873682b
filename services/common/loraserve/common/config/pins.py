"""Which pinned revisions (`NAME@REV`) an inference replica serves (`--pin-policy`),
and how long a pin another caller uses is safe from eviction (`--pin-idle`). The
registry that enforces them is loraserve.inference.adapters (pins.py)."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from dataclasses import dataclass

from loraserve.common.config.flags import non_negative_float


class PinPolicy(enum.Enum):
    """Which revisions a request may pin."""

    # None: a request names an adapter, and gets what the store routes.
    OFF = "off"
    # The adapter's current revision and its active rollout's candidate only: what the
    # store serves anyway. A rolled-back, aborted or unreleased revision is refused.
    ROLLOUT = "rollout"
    # Any revision the store holds that is not yanked.
    ANY = "any"


# What a production replica serves unless told otherwise: a caller cannot bring back
# a revision the store's writers rolled back, nor one they never released.
DEFAULT_PIN_POLICY = PinPolicy.ROLLOUT
# A pin used within this many seconds is never evicted for another: a caller cycling
# through revisions costs only its own loads, never another caller's pinned revision.
DEFAULT_PIN_IDLE_S = 60.0


@dataclass(frozen=True)
class PinSettings:
    policy: PinPolicy = DEFAULT_PIN_POLICY
    # Seconds without a request before a pinned revision may lose its place to
    # another pin (under `any`); 0: least recently used first out, at once.
    idle_s: float = DEFAULT_PIN_IDLE_S
    # Revisions pinned at once beyond those routed or rolled out (the engine's
    # max_cpu_loras on a server).
    max_pinned: int = 8

    def __post_init__(self) -> None:
        if self.max_pinned < 1:
            raise ValueError(f"max_pinned must be at least 1, got {self.max_pinned}")
        if not self.idle_s >= 0:
            raise ValueError(f"idle_s must be >= 0, got {self.idle_s}")


def add_pin_flags(flag: Callable[..., None]) -> None:
    """The pin flags, for a service's parser (`EnvFlags.add` bound to it)."""
    flag(
        "pin-policy",
        "which pinned revisions (NAME@REV) requests may ask for: rollout (the current "
        "revision and an active rollout's candidate only), any (every revision not "
        "yanked; at most --max-cpu-loras others are kept loaded), or off (none)",
        DEFAULT_PIN_POLICY.value,
        choices=tuple(p.value for p in PinPolicy),
    )
    flag(
        "pin-idle",
        "with --pin-policy any: seconds a pinned revision keeps its place after its last "
        "request; a pin of another revision that finds every place so kept is "
        "RESOURCE_EXHAUSTED (0: least recently used out first)",
        f"{DEFAULT_PIN_IDLE_S:g}",
        type=non_negative_float,
        metavar="SECONDS",
    )


def pin_settings_from_args(args: argparse.Namespace) -> PinSettings:
    """The pin flags' settings; `max_pinned` is the engine's, set once it runs."""
    return PinSettings(PinPolicy(args.pin_policy), float(args.pin_idle))

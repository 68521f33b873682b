"""Canary rollouts as the change log records them: plain data with a JSON form.

A rollout is a record in the log (a `Change` of type ROLLOUT_CHANGED carrying the
rollout as it is after the change), so every store replica folds the same rollout
at the same seq and every inference replica applies the same split at that seq; a
replica that restarts finds the rollout on its adapter in the listing. The store
keeps each adapter's active rollout, or the last one that ended, on the adapter
(`Adapter.rollout`) until the next one starts.

A rollout is named by `start_seq`, the seq of the entry that started it: a change
to "the rollout started at seq S" is refused once that rollout has ended, so two
store replicas aborting one rollout at once commit one abort, never two.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from loraserve.common.config.textlimits import MAX_ROLLOUT_CALLERS
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.manifest import time_from_json, time_to_json

DEFAULT_WINDOW_S = 60.0
DEFAULT_MIN_REQUESTS = 20
# Distinct callers an arm needs before it is judged: no one caller decides a verdict.
DEFAULT_MIN_CALLERS = 3
# The store's own aborts are made by this actor.
GUARD_ACTOR = "rollout-guard"


class RolloutState(enum.Enum):
    """Where a rollout is in its life; the values are what the log stores."""

    ACTIVE = "active"
    PROMOTED = "promoted"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Guards:
    """When the store aborts a rollout by itself (see guard.py)."""

    abort_on_nack: bool = True
    # Percentage points the candidate's error rate may exceed the current's by.
    max_error_rate_margin: float | None = None
    # Percent the candidate's TTFT p95 may exceed the current's by.
    max_ttft_p95_margin: float | None = None
    window_s: float = DEFAULT_WINDOW_S
    min_requests: int = DEFAULT_MIN_REQUESTS
    min_callers: int = DEFAULT_MIN_CALLERS

    def check(self) -> None:
        for name, margin in (
            ("max_error_rate_margin", self.max_error_rate_margin),
            ("max_ttft_p95_margin", self.max_ttft_p95_margin),
        ):
            if margin is not None and not (math.isfinite(margin) and margin >= 0):
                raise InvalidArgument(f"guards.{name} must be a number >= 0, got {margin}")
        if not (math.isfinite(self.window_s) and 1 <= self.window_s <= 86_400):
            raise InvalidArgument(
                f"guards.window_seconds must be from 1 to 86400, got {self.window_s}"
            )
        if not 1 <= self.min_requests <= 1_000_000_000:
            raise InvalidArgument(
                f"guards.min_requests must be from 1 to 1e9, got {self.min_requests}"
            )
        if not 1 <= self.min_callers <= MAX_ROLLOUT_CALLERS:
            # Replicas report their most recent callers only, so more could never be seen.
            raise InvalidArgument(
                f"guards.min_callers must be from 1 to {MAX_ROLLOUT_CALLERS}, "
                f"got {self.min_callers}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "abort_on_nack": self.abort_on_nack,
            "max_error_rate_margin": self.max_error_rate_margin,
            "max_ttft_p95_margin": self.max_ttft_p95_margin,
            "window_s": self.window_s,
            "min_requests": self.min_requests,
            "min_callers": self.min_callers,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Guards:
        error_margin = data.get("max_error_rate_margin")
        ttft_margin = data.get("max_ttft_p95_margin")
        return cls(
            abort_on_nack=bool(data["abort_on_nack"]),
            max_error_rate_margin=None if error_margin is None else float(error_margin),
            max_ttft_p95_margin=None if ttft_margin is None else float(ttft_margin),
            window_s=float(data["window_s"]),
            min_requests=int(data["min_requests"]),
            # Rollouts started before the minimum existed get the default.
            min_callers=int(data.get("min_callers", DEFAULT_MIN_CALLERS)),
        )


@dataclass(frozen=True, slots=True)
class ArmFigures:
    """One arm's requests over a window, summed over the replicas that reported."""

    revision: int
    requests: int = 0
    errors: int = 0
    ttft_p95_s: float = 0.0
    generated_tokens: int = 0
    # Distinct callers in the window (at least: see RevisionCounters.callers).
    callers: int = 0

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def describe(self) -> str:
        return (
            f"@{self.revision}: {self.requests} requests from {self.callers} callers, "
            f"{self.errors} errors ({100 * self.error_rate:.1f} %), "
            f"TTFT p95 {1000 * self.ttft_p95_s:.0f} ms"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "requests": self.requests,
            "errors": self.errors,
            "ttft_p95_s": self.ttft_p95_s,
            "generated_tokens": self.generated_tokens,
            "callers": self.callers,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArmFigures:
        return cls(
            revision=int(data["revision"]),
            requests=int(data["requests"]),
            errors=int(data["errors"]),
            ttft_p95_s=float(data["ttft_p95_s"]),
            generated_tokens=int(data["generated_tokens"]),
            callers=int(data.get("callers", 0)),
        )


@dataclass(frozen=True, slots=True)
class Rollout:
    """One adapter's rollout as of its latest change."""

    adapter_name: str
    candidate_revision: int
    # The current revision when it started: the other arm.
    current_revision: int
    weight: float
    state: RolloutState
    guards: Guards
    start_seq: int
    update_seq: int
    start_time: datetime
    update_time: datetime
    started_by: str
    updated_by: str
    end_reason: str = ""
    # Both arms' figures when it ended, the current arm first.
    final_figures: tuple[ArmFigures, ...] = field(default=())

    @property
    def active(self) -> bool:
        return self.state is RolloutState.ACTIVE

    def describe(self) -> str:
        """E.g. `rollout of alpha@3 (from @2, started at seq 17)`."""
        return (
            f"rollout of {self.adapter_name}@{self.candidate_revision} "
            f"(from @{self.current_revision}, started at seq {self.start_seq})"
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "adapter_name": self.adapter_name,
            "candidate_revision": self.candidate_revision,
            "current_revision": self.current_revision,
            "weight": self.weight,
            "state": self.state.value,
            "guards": self.guards.to_json(),
            "start_seq": self.start_seq,
            "update_seq": self.update_seq,
            "start_time": time_to_json(self.start_time),
            "update_time": time_to_json(self.update_time),
            "started_by": self.started_by,
            "updated_by": self.updated_by,
        }
        if self.end_reason:
            data["end_reason"] = self.end_reason
        if self.final_figures:
            data["final_figures"] = [f.to_json() for f in self.final_figures]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rollout:
        return cls(
            adapter_name=str(data["adapter_name"]),
            candidate_revision=int(data["candidate_revision"]),
            current_revision=int(data["current_revision"]),
            weight=float(data["weight"]),
            state=RolloutState(data["state"]),
            guards=Guards.from_json(data["guards"]),
            start_seq=int(data["start_seq"]),
            update_seq=int(data["update_seq"]),
            start_time=time_from_json(data["start_time"]),
            update_time=time_from_json(data["update_time"]),
            started_by=str(data["started_by"]),
            updated_by=str(data["updated_by"]),
            end_reason=str(data.get("end_reason", "")),
            final_figures=tuple(ArmFigures.from_json(f) for f in data.get("final_figures", [])),
        )


def check_weight(weight: float) -> None:
    if not (math.isfinite(weight) and 0 <= weight <= 100):
        raise InvalidArgument(f"weight must be a percentage from 0 to 100, got {weight}")

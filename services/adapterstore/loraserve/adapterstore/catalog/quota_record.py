"""A quota change as the change log records it: the quota after the change.

A QUOTA_SET entry names an adapter (its own quota, kept on the adapter and gone with
it) or no adapter ("": the default quota of every adapter without its own, kept on the
state). Every store replica folds it at the same seq and every inference replica
enforces it from there; a restarted replica finds it in the listing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loraserve.common.quota import LIMIT_RANGES, Quota

# The adapter name of a change to the default quota.
DEFAULT_QUOTA = ""


@dataclass(frozen=True, slots=True)
class QuotaChange:
    """The quota after the change; None once cleared."""

    quota: Quota | None

    def to_json(self) -> dict[str, Any]:
        return {"quota": None if self.quota is None else self.quota.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuotaChange:
        quota = data.get("quota")
        return cls(None if quota is None else Quota.from_json(_in_range(quota)))


def _in_range(limits: dict[str, Any]) -> dict[str, Any]:
    """`limits` with each brought into its range: entries committed before the ranges
    were enforced took any positive number, and the log must still fold."""
    clamped = dict(limits)
    for name, (low, high) in LIMIT_RANGES.items():
        value = limits.get(name)
        if value is not None:
            clamped[name] = min(max(value, low), high)
    return clamped

"""Where the change made for an idempotency key was committed (idempotency.py says
what the keys are for); the folded state keeps one per key of its window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Where the change made for an idempotency key was committed, and a digest of
    the request that made it."""

    seq: int
    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "digest": self.digest}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(seq=int(data["seq"]), digest=str(data["digest"]))

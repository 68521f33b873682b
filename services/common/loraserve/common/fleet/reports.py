"""What an inference replica reports of the adapters it routes, as typed values: the
replica builds them (and the client turns them into requests), the store decodes
requests into them, checks them and keeps them in object storage in their JSON form.

The JSON form is what stores have already written: keys and state strings must stay
as they are, or objects written before no longer read. The checks a report must pass
live with the store (adapterstore.replicas.model).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb


class ServingState(enum.Enum):
    """What a replica does with a revision; the values are what storage keeps."""

    ROUTED = "routed"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


# Each state's value in the contract (RevisionServingState).
SERVING_STATES_PB: Final[Mapping[ServingState, pb.RevisionServingState]] = MappingProxyType(
    {
        ServingState.ROUTED: pb.REVISION_SERVING_STATE_ROUTED,
        ServingState.LOADING: pb.REVISION_SERVING_STATE_LOADING,
        ServingState.LOADED: pb.REVISION_SERVING_STATE_LOADED,
        ServingState.FAILED: pb.REVISION_SERVING_STATE_FAILED,
    }
)


@dataclass(frozen=True, slots=True)
class ReplicaError:
    """Why a revision FAILED on a replica."""

    code: int  # a google.rpc.Code value
    message: str


@dataclass(frozen=True, slots=True)
class RevisionReport:
    revision: int
    state: ServingState
    # FAILED only.
    error: ReplicaError | None = None
    candidate: bool = False

    @property
    def answered(self) -> bool:
        """Routed or loaded: the replica serves it (a push --wait ACK)."""
        return self.state in (ServingState.ROUTED, ServingState.LOADED)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"revision": self.revision, "state": self.state.value}
        if self.error is not None:
            data["error"] = {"code": self.error.code, "message": self.error.message}
        if self.candidate:
            data["candidate"] = True
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RevisionReport:
        error = data.get("error")
        return cls(
            revision=int(data["revision"]),
            state=ServingState(data["state"]),
            error=ReplicaError(int(error["code"]), str(error["message"])) if error else None,
            candidate=bool(data.get("candidate", False)),
        )


@dataclass(frozen=True, slots=True)
class AdapterReport:
    """What one replica routes of one adapter: the revision its requests go to, and
    every revision it routes or refused."""

    name: str
    serving_revision: int
    revisions: tuple[RevisionReport, ...]

    def revision(self, number: int) -> RevisionReport | None:
        return next((r for r in self.revisions if r.revision == number), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "serving_revision": self.serving_revision,
            "revisions": [r.to_json() for r in self.revisions],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AdapterReport:
        return cls(
            name=str(data["name"]),
            serving_revision=int(data["serving_revision"]),
            revisions=tuple(RevisionReport.from_json(r) for r in data["revisions"]),
        )


@dataclass(frozen=True, slots=True)
class CallerSighting:
    """One of a revision's most recent distinct callers on a replica. Distinct callers
    cannot be differenced over a window as counts can, so each is reported with the
    revision's request count when it was last seen: the store counts those seen after
    the count its window starts from, and the hashes merge across replicas."""

    # 64 bits of a hash of the caller's identity, the same on every replica.
    caller: int
    # The revision's `requests` counter right after this caller's latest request.
    last_request: int


@dataclass(frozen=True, slots=True)
class RevisionCounters:
    """Cumulative counts of one revision's requests on one replica, since the start
    of its counters' epoch."""

    name: str
    revision: int
    requests: int
    errors: int
    generated_tokens: int
    # Cumulative per TTFT bound, then every request with a first token.
    ttft_buckets: tuple[int, ...]
    # The most recent distinct callers (at most MAX_ROLLOUT_CALLERS), oldest first.
    callers: tuple[CallerSighting, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "revision": self.revision,
            "requests": self.requests,
            "errors": self.errors,
            "generated_tokens": self.generated_tokens,
            "ttft_buckets": list(self.ttft_buckets),
        }
        if self.callers:
            data["callers"] = [[c.caller, c.last_request] for c in self.callers]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RevisionCounters:
        return cls(
            name=str(data["name"]),
            revision=int(data["revision"]),
            requests=int(data["requests"]),
            errors=int(data["errors"]),
            generated_tokens=int(data["generated_tokens"]),
            ttft_buckets=tuple(int(n) for n in data["ttft_buckets"]),
            # Objects written before replicas reported callers have none.
            callers=tuple(CallerSighting(int(c), int(n)) for c, n in data.get("callers", ())),
        )

    def to_proto(self) -> pb.RevisionCounters:
        return pb.RevisionCounters(
            adapter_name=self.name,
            revision=self.revision,
            requests=self.requests,
            errors=self.errors,
            generated_tokens=self.generated_tokens,
            ttft_buckets=list(self.ttft_buckets),
            callers=[
                pb.CallerSighting(caller=c.caller, last_request=c.last_request)
                for c in self.callers
            ],
        )

    @classmethod
    def from_proto(cls, message: pb.RevisionCounters) -> RevisionCounters:
        return cls(
            message.adapter_name,
            message.revision,
            message.requests,
            message.errors,
            message.generated_tokens,
            tuple(message.ttft_buckets),
            tuple(CallerSighting(c.caller, c.last_request) for c in message.callers),
        )

"""What a running inference server is made of once its engine is up.

The gRPC server starts before the engine (so health checks answer NOT_SERVING during
the engine's slow start); until the runtime is set, calls get UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loraserve.common.errors import Unavailable
from loraserve.inference.adapters import AdapterRegistry, RolloutKeys, TierView
from loraserve.inference.engine import Engine
from loraserve.inference.serving.admission import Admission
from loraserve.inference.serving.fairness import FairGate
from loraserve.inference.serving.generation import Generator
from loraserve.inference.serving.slots import SlotGate


@dataclass(frozen=True)
class Runtime:
    engine: Engine
    registry: AdapterRegistry
    generator: Generator
    admission: Admission
    replica_id: str
    # The store seq the sync side has applied; 0 before the first sync.
    store_seq: Callable[[], int] = lambda: 0
    # The adapter tiers' occupancy; None where no cache backs the registry (tests).
    tiers: TierView | None = None
    # Fair admission into the engine; None where it is off (--admission-order fifo).
    gate: FairGate | None = None
    # LoRA slots in turn; None where vLLM orders them (--lora-slot-order engine).
    slots: SlotGate | None = None


class RuntimeRef:
    """Holds the runtime once it exists, and what the fronts share from the start."""

    def __init__(
        self, runtime: Runtime | None = None, *, trust_rollout_key_header: bool = False
    ) -> None:
        self._runtime = runtime
        self._waiting = ""
        # How every front derives a request's rollout key and caller.
        self.rollout_keys = RolloutKeys(trust_rollout_key_header)

    def set(self, runtime: Runtime | None) -> None:
        self._runtime = runtime

    def set_waiting(self, reason: str) -> None:
        """What start-up waits for before the engine can start, for UNAVAILABLE answers."""
        self._waiting = reason

    def get(self) -> Runtime:
        if self._runtime is None:
            if self._waiting:
                raise Unavailable(f"the inference engine is not started: {self._waiting}")
            raise Unavailable("the inference engine is starting; retry shortly")
        return self._runtime

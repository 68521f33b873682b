"""Bounded admission: a fixed number of sequences in the server at once, the rest refused.

A request counts as its `n` sequences (choices), since that is what the engine runs:
one request with a large `n` fills the engine as much as that many requests. Refusing
at the door (RESOURCE_EXHAUSTED, which clients retry elsewhere or later) keeps memory
and the engine's batch bounded; queueing without a bound would only move the overload
into this process. `n` itself is capped (`max_n`): a request over it could never run
well, so it is INVALID_ARGUMENT rather than a retry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from loraserve.common.errors import InvalidArgument, ResourceExhausted
from loraserve.inference.serving.admission_rates import AdmissionRates


class Admission:
    """Counts admitted sequences against `max_pending`; each request's n against `max_n`."""

    def __init__(
        self,
        max_pending: int,
        max_n: int | None = None,
        rates: AdmissionRates | None = None,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        max_n = max_pending if max_n is None else max_n
        if not 1 <= max_n <= max_pending:
            raise ValueError(f"max_n must be in [1, max_pending={max_pending}], got {max_n}")
        self._max_pending = max_pending
        self._max_n = max_n
        self._pending = 0
        # Pending sequences by adapter label, only those with any: at most max_pending.
        self._by_adapter: Counter[str] = Counter()
        self._rates = AdmissionRates() if rates is None else rates

    @property
    def max_pending(self) -> int:
        return self._max_pending

    @property
    def max_n(self) -> int:
        return self._max_n

    @property
    def pending(self) -> int:
        """Sequences admitted and not finished."""
        return self._pending

    def pending_by_adapter(self) -> dict[str, int]:
        """Sequences admitted and not finished, by the adapter label they came with."""
        return dict(self._by_adapter)

    def admission_rates(self) -> dict[str, float]:
        """Sequences admitted per second by adapter label (`AdmissionRates`): every label
        pending, or admitted lately."""
        return self._rates.rates(keep=self._by_adapter.__contains__)

    def tokens_per_sequence(self, adapters: Iterable[str]) -> dict[str, float]:
        """Of `adapters` (from the last `admission_rates`), the tokens a sequence that ran
        generated lately, as of the same moment (`AdmissionRates.tokens_per_sequence`)."""
        return self._rates.tokens_per_sequence(adapters, self._rates.as_of)

    def ran(self, adapter: str, sequences: int, generated: int) -> None:
        """Counts a request of `adapter` (its label) that ran in the engine and ended:
        its `sequences` generated `generated` tokens between them."""
        self._rates.ran(adapter, sequences, generated)

    @property
    def admission_rates_as_of(self) -> float:
        """The wall-clock second the last `admission_rates` were as of."""
        return self._rates.as_of

    @contextmanager
    def admit(self, sequences: int = 1, adapter: str = "") -> Iterator[None]:
        """Holds `sequences` units of admission (a request's n) for `adapter` (its label);
        raises InvalidArgument for an n over `max_n`, ResourceExhausted when that many are
        not free."""
        if sequences > self._max_n:
            raise InvalidArgument(
                f"sampling.n={sequences} is over this server's limit of {self._max_n} "
                "choices per prompt (--max-n)"
            )
        if self._pending + sequences > self._max_pending:
            raise ResourceExhausted(
                f"server is at its limit of {self._max_pending} pending sequences "
                f"({self._pending} admitted, this request needs {sequences}); retry later"
            )
        self._pending += sequences
        self._by_adapter[adapter] += sequences
        self._rates.admitted(adapter, sequences)
        try:
            yield
        finally:
            self._pending -= sequences
            self._by_adapter[adapter] -= sequences
            if not self._by_adapter[adapter]:
                del self._by_adapter[adapter]

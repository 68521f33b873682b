"""What a comparison reports: one break of one rule, at one declaration."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Break:
    """A change that breaks clients of the previous release, named for buf's rule."""

    file: str
    what: str
    rule: str
    details: str

    def __str__(self) -> str:
        return f"proto/{self.file}:{self.what}: {self.rule}: {self.details}"


def changes(
    file: str, what: str, subject: str, checks: Iterable[tuple[str, str, object, object]]
) -> list[Break]:
    """A break for each `(rule, property, old, new)` whose values differ."""
    return [
        Break(file, what, rule, f"{subject} {prop} changed from {old!r} to {new!r}")
        for rule, prop, old, new in checks
        if old != new
    ]

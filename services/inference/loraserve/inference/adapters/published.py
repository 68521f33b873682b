"""Which trace made each name's current revision servable here, until the first request
that revision serves takes it for a span link.

The trace is the one current when sync routed the revision: its `loraserve.replica.sync`
span, a child of the push's (or set-current's) trace the store's event carried. That
first request is its own trace, not a child of the push; the link is how an operator
gets from it to the push, and from the push to the first token it led to. One per name:
a revision superseded before any request leaves nothing behind.
"""

from __future__ import annotations

from loraserve.common.revisions.manifest import RevisionKey
from loraserve.common.tracing import current_traceparent


class PublishTraces:
    """The traceparent that routed each name's current revision, until it is taken."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[int, str]] = {}

    def record(self, key: RevisionKey) -> None:
        """The current trace routed `key` (sync's span; none outside a trace)."""
        traceparent = current_traceparent()
        if traceparent:
            self._by_name[key.name] = (key.revision, traceparent)
        else:
            self._by_name.pop(key.name, None)

    def take(self, name: str, revision: int) -> str:
        """The trace that routed `name`@`revision`, once: "" for any later request, a
        revision it did not route, or none recorded."""
        held = self._by_name.get(name)
        if held is None or held[0] != revision:
            return ""
        del self._by_name[name]
        return held[1]

    def forget(self, name: str) -> None:
        self._by_name.pop(name, None)

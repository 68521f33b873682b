"""The store's signature policy on the writes that make an existing revision served:
SetCurrentRevision (so rollback too) and a rollout's start.

A push is checked as it arrives (store.push), but the revision these name may have
been pushed while the policy was off or warn, or written into the log by a bucket
writer. Made current under `require`, every replica under the same policy would
refuse it and a restarted one would serve nothing for the adapter; so the store
checks it as a replica would (the signature against the revision's commit time) and
refuses the write instead.
"""

from __future__ import annotations

from loraserve.adapterstore.changelog import ChangeLog
from loraserve.common.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from loraserve.common.trust.policy import RevisionTrust, SignaturePolicy


class ServedRevisionCheck:
    """`RevisionTrust.check_revision` of the revision a write is about to serve."""

    def __init__(self, changelog: ChangeLog, trust: RevisionTrust) -> None:
        self._log = changelog
        self._trust = trust

    async def check(self, name: str, revision: int, made: str) -> None:
        """FailedPrecondition naming `name`@`revision`, what the write would make it
        (`made`: "current", "a rollout candidate") and why it fails the policy, under
        require; under warn the failure is logged (`signature.unverified`) and the
        write goes on. A revision not found is left to the write, which answers
        NotFound as before."""
        if self._trust.policy is SignaturePolicy.OFF:
            return
        await self._log.sync()
        adapter = self._log.state.adapters.get(name)
        target = adapter.revisions.get(revision) if adapter is not None else None
        if target is None:
            return
        try:
            self._trust.check_revision(target)
        except (FailedPrecondition, InvalidArgument, PermissionDenied) as exc:
            raise FailedPrecondition(
                f"{target.key} cannot be made {made}: it fails the store's signature policy "
                f"(--signature-policy require): {exc.message}"
            ) from None

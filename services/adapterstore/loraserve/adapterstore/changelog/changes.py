"""The Change each write makes, built from the freshest folded state.

Each function returns a ChangeBuilder for ChangeLog.commit: it only reads the
state it is given (commit may call it again after a lost race) and raises the
caller-facing error when the write no longer applies; None means nothing to
commit.
"""

from __future__ import annotations

from loraserve.adapterstore.catalog import (
    Change,
    ChangeType,
    StoreState,
    find_adapter,
    find_revision,
    now,
    refuse_during_rollout,
    refuse_yanked,
)
from loraserve.adapterstore.changelog.logtypes import ChangeBuilder
from loraserve.adapterstore.files import LoraConfig, PushHeader
from loraserve.common.errors import Aborted
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.trust.signing import Signed


def revision_pushed(
    header: PushHeader,
    files: tuple[FileInfo, ...],
    config: LoraConfig,
    actor: str,
    signed: Signed | None = None,
) -> ChangeBuilder:
    """A new revision numbered after every earlier one, current unless `no_promote`.
    A verified signature names the number the revision must get: another number
    (another push committed first) is Aborted, to be signed again."""

    def build(state: StoreState, seq: int) -> Change:
        adapter = state.adapters.get(header.name)
        if adapter is not None and not header.no_promote:
            refuse_during_rollout(adapter, "promote or abort it first, or push with --no-promote")
        time = now()
        number = state.next_revision(header.name)
        if signed is not None and signed.revision != number:
            raise Aborted(
                f"the signature is for {header.name}@{signed.revision}, but this push would "
                f"be {header.name}@{number}: sign it again for the next revision"
            )
        revision = Revision(
            adapter_name=header.name,
            revision=number,
            files=files,
            base_model=config.base_model,
            rank=config.rank,
            alpha=config.alpha,
            target_modules=config.target_modules,
            create_time=time,
            pushed_by=actor,
            description=header.description,
            seq=seq,
            signature=header.signature,
            signed_by=signed.signer if signed is not None else "",
        )
        current = revision.revision
        if header.no_promote:
            current = adapter.current_revision if adapter else 0
        return Change(seq, ChangeType.REVISION_PUSHED, header.name, revision, current, time, actor)

    return build


def current_set(name: str, revision: int, expected_current: int, actor: str) -> ChangeBuilder:
    """Moves `current` to an existing revision; None when it is current already."""

    def build(state: StoreState, seq: int) -> Change | None:
        adapter = find_adapter(state, name)
        target = find_revision(adapter, revision)
        if expected_current and adapter.current_revision != expected_current:
            raise Aborted(
                f"adapter {name}: current revision is {adapter.current_revision}, "
                f"not the expected {expected_current}"
            )
        if adapter.current_revision == revision:
            return None
        refuse_during_rollout(adapter, "promote or abort it before rolling back")
        refuse_yanked(adapter, revision, "made current")
        return Change(seq, ChangeType.CURRENT_REVISION_SET, name, target, revision, now(), actor)

    return build


def adapter_deleted(name: str, actor: str) -> ChangeBuilder:
    def build(state: StoreState, seq: int) -> Change:
        refuse_during_rollout(find_adapter(state, name), "abort it before deleting the adapter")
        return Change(seq, ChangeType.ADAPTER_DELETED, name, None, 0, now(), actor)

    return build

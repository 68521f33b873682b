"""Conversions between rollouts and their protobuf messages."""

from __future__ import annotations

from loraserve.adapterstore.rollout.records import (
    DEFAULT_MIN_CALLERS,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_WINDOW_S,
    ArmFigures,
    Guards,
    Rollout,
    RolloutState,
)
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.revisions.manifest import Revision, revision_to_proto, timestamp

_STATES = {
    RolloutState.ACTIVE: pb.ROLLOUT_STATE_ACTIVE,
    RolloutState.PROMOTED: pb.ROLLOUT_STATE_PROMOTED,
    RolloutState.ABORTED: pb.ROLLOUT_STATE_ABORTED,
}


def guards(message: pb.RolloutGuards) -> Guards:
    """The guards a request asks for; zeros mean the defaults."""
    return Guards(
        abort_on_nack=message.abort_on_nack,
        max_error_rate_margin=(
            message.max_error_rate_margin if message.HasField("max_error_rate_margin") else None
        ),
        max_ttft_p95_margin=(
            message.max_ttft_p95_margin if message.HasField("max_ttft_p95_margin") else None
        ),
        window_s=message.window_seconds or DEFAULT_WINDOW_S,
        min_requests=message.min_requests or DEFAULT_MIN_REQUESTS,
        min_callers=message.min_callers or DEFAULT_MIN_CALLERS,
    )


def guards_message(value: Guards) -> pb.RolloutGuards:
    message = pb.RolloutGuards(
        abort_on_nack=value.abort_on_nack,
        window_seconds=value.window_s,
        min_requests=value.min_requests,
        min_callers=value.min_callers,
    )
    if value.max_error_rate_margin is not None:
        message.max_error_rate_margin = value.max_error_rate_margin
    if value.max_ttft_p95_margin is not None:
        message.max_ttft_p95_margin = value.max_ttft_p95_margin
    return message


def figures(value: ArmFigures) -> pb.ArmFigures:
    return pb.ArmFigures(
        revision=value.revision,
        requests=value.requests,
        errors=value.errors,
        error_rate=value.error_rate,
        ttft_p95_seconds=value.ttft_p95_s,
        generated_tokens=value.generated_tokens,
        callers=value.callers,
    )


def rollout(value: Rollout, candidate: Revision) -> pb.Rollout:
    return pb.Rollout(
        adapter_name=value.adapter_name,
        candidate_revision=value.candidate_revision,
        current_revision=value.current_revision,
        weight=value.weight,
        state=_STATES[value.state],
        guards=guards_message(value.guards),
        start_seq=value.start_seq,
        update_seq=value.update_seq,
        start_time=timestamp(value.start_time),
        update_time=timestamp(value.update_time),
        started_by=value.started_by,
        updated_by=value.updated_by,
        end_reason=value.end_reason,
        final_figures=[figures(f) for f in value.final_figures],
        candidate=revision_to_proto(candidate),
    )

"""The `SamplingParams` fields the contract marks proto3 `optional`: unset means the
server's default, so both sides read them by presence. Derived from the contract, so
a field added there is carried by the client and the server alike."""

from __future__ import annotations

from loraserve.inference.v1 import inference_pb2 as pb

OPTIONAL_SAMPLING_FIELDS: tuple[str, ...] = tuple(
    field.name
    for field in pb.SamplingParams.DESCRIPTOR.fields
    if field.has_presence and field.type != field.TYPE_MESSAGE
)

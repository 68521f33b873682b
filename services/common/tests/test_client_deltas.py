"""How the inference client reads a stream's messages as `Delta`s (no server)."""

from __future__ import annotations

import dataclasses

import pytest

from loraserve.clients.generation import Delta, delta_from
from loraserve.inference.v1 import inference_pb2 as pb


def test_a_plain_message_reads_as_the_delta_the_constructor_makes() -> None:
    delta = delta_from(pb.GenerateResponse(text="ab", token_ids=[5, 6]))

    assert delta == Delta("ab", (5, 6))
    assert repr(delta) == repr(Delta("ab", (5, 6)))
    assert delta_from(pb.GenerateResponse()) == Delta("", ())
    with pytest.raises(dataclasses.FrozenInstanceError):
        delta.text = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (pb.GenerateResponse(text="a", adapter_name="x", revision=2), Delta("a", (), "x", 2)),
        (
            pb.GenerateResponse(
                token_ids=[1],
                finish_reason=pb.FINISH_REASON_STOP,
                usage=pb.Usage(prompt_tokens=3, completion_tokens=4),
            ),
            Delta("", (1,), finish_reason="stop", prompt_tokens=3, completion_tokens=4),
        ),
        (pb.GenerateResponse(text="b", index=1), Delta("b", (), index=1)),
    ],
)
def test_a_message_with_more_than_the_delta_keeps_every_field(
    message: pb.GenerateResponse, expected: Delta
) -> None:
    assert delta_from(message) == expected

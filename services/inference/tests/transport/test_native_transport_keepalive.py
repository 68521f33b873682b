"""The native transport's keepalive: the peers it pings, and those it drops."""

from __future__ import annotations

import asyncio

import pytest

from loraserve.inference.serving import GENERATE_METHOD
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.inference.native import native_only
from loraserve.testing.inference.native_fronts import (
    forever,
    front_watching_cancels,
    native_front,
    x_then_y,
)
from loraserve.testing.inference.raw_h2 import Heard, RawClient
from loraserve.testing.waiting import eventually

pytestmark = native_only


async def test_native_transport_drops_a_connection_whose_peer_stops_answering_pings() -> None:
    async with front_watching_cancels(keepalive_s=(0.2, 0.2)) as (port, cancelled):
        # The raw client answers nothing once its call is sent: not the server's pings.
        client = await asyncio.to_thread(RawClient, port)
        try:
            client.call(GENERATE_METHOD)
            await eventually(cancelled.is_set, "the call's handler cancelled")
        finally:
            client.close()


async def test_native_transport_keeps_a_connection_whose_peer_answers_pings() -> None:
    go_on, timeout_s = asyncio.Event(), 1.0
    front = native_front(x_then_y(go_on), keepalive_s=(0.1, timeout_s))
    client = await asyncio.to_thread(RawClient, front.port)
    heard = Heard()
    try:
        stream = client.call(GENERATE_METHOD)

        def past_a_timeout_of_answered_pings(so_far: Heard) -> bool:
            # A front that dropped the peer whatever it answered would have dropped it
            # by the time pings have gone on for longer than their timeout.
            pings = so_far.pings
            return bool(so_far.messages()) and len(pings) >= 3 and pings[-1] - pings[0] > timeout_s

        await asyncio.to_thread(client.listen, stream, heard, past_a_timeout_of_answered_pings)
        first = heard.messages()
        go_on.set()
        await asyncio.to_thread(client.listen, stream, heard, lambda so_far: so_far.ended)
    finally:
        client.close()
        front.close()
    assert [pb.GenerateResponse.FromString(m).text for m in first] == ["x"]
    assert heard.trailers[b"grpc-status"] == b"0"
    assert [pb.GenerateResponse.FromString(m).text for m in heard.messages()] == ["x", "y"]


@pytest.mark.parametrize("keepalive", [(0.0, 1.0), (1.0, float("nan"))])
async def test_native_transport_refuses_a_keepalive_it_cannot_keep(
    keepalive: tuple[float, float],
) -> None:
    with pytest.raises(ValueError, match=r"keepalive \w+ must be seconds in"):
        native_front(forever, keepalive_s=keepalive)

"""What a test watches while a fleet is upgraded in place: a closed-loop client across
replicas, WatchAdapters streams read in the background, and the change log as the
bucket holds it."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.clients.inference import InferenceClient, Sampling
from loraserve.common.errors import LoraserveError, Unavailable
from loraserve.testing.inference.app import PROMPT
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import keys_under

# (seq, type, adapter, revision, current revision) of a watched change.
Event = tuple[int, str, str, int, int]
# Replicas by name, in the order a request tries them.
Order = Sequence[tuple[str, InferenceClient]]


@dataclass
class Load:
    """Requests of a closed-loop client: served, by replica, and failed, with why."""

    served: Counter[str] = field(default_factory=Counter)
    failed_before_first_token: list[str] = field(default_factory=list)
    failed_after_first_token: list[str] = field(default_factory=list)


async def closed_loop(
    order: Order, adapter: str, sampling: Sampling, load: Load, stop: asyncio.Event
) -> None:
    """Requests for `adapter` one after another until `stop`, each outcome counted."""
    while not stop.is_set():
        await _one_request(order, adapter, sampling, load)


async def _one_request(order: Order, adapter: str, sampling: Sampling, load: Load) -> None:
    """One request, sent to the next replica in `order` when one refuses it UNAVAILABLE
    before its first token, as a load balancer moves it off a replica going away."""
    refusals = []
    for name, client in order:
        got_token = False
        try:
            async for delta in client.stream(adapter, PROMPT, sampling):
                got_token = got_token or bool(delta.token_ids)
        except LoraserveError as e:
            if isinstance(e, Unavailable) and not got_token:
                refusals.append(f"{name}: {e}")
                continue
            failed = load.failed_after_first_token if got_token else load.failed_before_first_token
            failed.append(f"{name}: {e!r}")
            return
        load.served[name] += 1
        return
    load.failed_before_first_token.append("; ".join(refusals))


class Watch:
    """A WatchAdapters stream from seq 0, read in the background until closed."""

    def __init__(self, stub: Any) -> None:
        self.events: list[Event] = []
        # The seq of the latest heartbeat: the stream had sent every change up to it.
        self.quiet_at = 0
        self._call = stub.WatchAdapters(store_pb.WatchAdaptersRequest(after_seq=0))
        self._reading = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self._call:
            if message.HasField("event"):
                e = message.event
                kind = store_pb.EventType.Name(e.type)
                self.events.append(
                    (e.seq, kind, e.adapter_name, e.revision.revision, e.current_revision)
                )
            else:
                self.quiet_at = message.heartbeat.seq

    async def close(self) -> list[Event]:
        """Ends the stream; every change it delivered."""
        self._call.cancel()
        await asyncio.gather(self._reading, return_exceptions=True)
        return self.events


def log_entries(bucket: S3Bucket) -> list[dict[str, Any]]:
    """Every change log entry in the bucket as its JSON, in seq order."""
    client = bucket.client()
    return [
        json.loads(client.get_object(Bucket=bucket.bucket, Key=key)["Body"].read())
        for key in keys_under(bucket.keys(), "log/")
    ]

"""`python -m bench.load.loadgen`: the load generator, always in a process of its own (never
inside a server's event loop). The benchmark driver sends one JSON line per arm run on
stdin and reads one JSON line back on stdout:

    {"target": {...}, "workload": {...}, "load": {...}, "timing": {...},
     "watch": {"front": PID, ...}}  ->  bench.load.drive's window figures

`target` says how to call the server (bench.load.targets); `watch` names processes whose
CPU time (user + system, children excluded) is read at the window's start and end,
beside this process's own ("client"). Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Any

from bench.load.drive import Load, Timing, drive
from bench.load.targets import Target, caller_for
from bench.load.workload import Workload

log = logging.getLogger(__name__)


async def run_one(message: dict[str, Any]) -> dict[str, Any]:
    target = Target(**message["target"])
    workload = Workload.from_json(message["workload"])
    load = Load(**message["load"])
    timing = Timing(**message["timing"])
    log.info("loadgen.run target=%s warmup_s=%g", target.kind, timing.warmup_s)
    async with caller_for(target) as (call, reconnects):
        figures = await drive(workload, load, timing, call, message.get("watch", {}))
    figures["reconnects"] = reconnects.count
    return figures


async def _main() -> None:
    while line := await asyncio.to_thread(sys.stdin.readline):
        try:
            reply = await run_one(json.loads(line))
        except Exception as exc:
            log.exception("loadgen.failed")
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def main() -> None:
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # Each run's start and the clients' placement moves, in the log: what explains an
    # adapter split over replicas.
    for name in ("loraserve.clients.balancing", __name__):
        logging.getLogger(name).setLevel(logging.INFO)
    asyncio.run(_main())


if __name__ == "__main__":
    main()

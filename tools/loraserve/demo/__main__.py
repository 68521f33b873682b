"""`python -m loraserve.demo` (what `make run` runs): the whole stack until Ctrl-C.

Exit status: 0 after a requested stop (Ctrl-C, SIGTERM, SIGHUP), 1 when a part failed
to start or a server exited on its own, 2 for bad flags.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from loraserve.common.errors import LoraserveError
from loraserve.demo.howto import howto
from loraserve.demo.settings import RunSettings, parse_settings
from loraserve.demo.showcase import SWAP_ADAPTER, Showcase, hot_swap_scene, same_prompt_scene
from loraserve.demo.stack import Endpoints, Stack

log = logging.getLogger("loraserve.demo")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


async def run(settings: RunSettings) -> int:
    """Brings the stack up, shows it, serves until a stop signal or a server's exit."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    force = asyncio.Event()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            # A second Ctrl-C: the person does not want to wait for a graceful stop.
            force.set()
        else:
            _say(f"\n{signal.Signals(signum).name}: stopping (again to stop at once)...")
        stop.set()

    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    stack = Stack(settings, echo=sys.stderr if settings.echo_logs else None, say=_say)
    work = asyncio.create_task(_serve(stack, settings), name="bring-up")
    stopped = asyncio.create_task(stop.wait())
    exited = asyncio.create_task(stack.exited.wait())
    try:
        # `work` never returns: it ends only by failing or by being cancelled.
        await asyncio.wait({work, stopped, exited}, return_when=asyncio.FIRST_COMPLETED)
        code = 0 if stopped.done() else 1
        if code:
            _report_failure(stack, work)
    finally:
        for task in (work, stopped, exited):
            task.cancel()
        await asyncio.gather(work, stopped, exited, return_exceptions=True)
        _say("stopping the servers...")
        await stack.shut_down(force)
        for sig in _STOP_SIGNALS:
            loop.remove_signal_handler(sig)
    left = stack.leftover_pids()
    if left:
        _say(f"error: processes still running: {left}")
        return 1
    _say("stopped.")
    return code


def _report_failure(stack: Stack, work: asyncio.Task[None]) -> None:
    dead = stack.dead_server()
    if dead is not None:
        _say(
            f"error: {dead.name} exited with status {dead.returncode}; its last lines "
            f"(full log: {dead.log_path}):"
        )
        for line in dead.tail()[-15:]:
            _say(f"  {line}")
        return
    error = work.exception() if work.done() else None
    message = error.message if isinstance(error, LoraserveError) else repr(error)
    _say(f"error: {message}")


async def _serve(stack: Stack, settings: RunSettings) -> None:
    """Brings the stack up, runs the showcase, prints how to use it; then waits forever."""
    endpoints = await stack.bring_up()
    if settings.showcase and endpoints.demo is not None:
        try:
            await _showcase(settings, endpoints)
        except LoraserveError as exc:
            # The stack itself is up; a failed demonstration is no reason to stop it.
            _say(f"the showcase failed: {exc.message}; the servers keep running")
    _say(howto(settings, endpoints))
    await asyncio.Event().wait()


async def _showcase(settings: RunSettings, endpoints: Endpoints) -> None:
    assert endpoints.demo is not None
    showcase = Showcase(
        store_address=endpoints.store_address,
        inference_address=endpoints.inference_address,
        security=settings.client_security,
        voices=endpoints.demo.adapters,
    )
    _say("")
    await same_prompt_scene(showcase, _say)
    names = [name for name in endpoints.demo.adapters if name != SWAP_ADAPTER]
    await hot_swap_scene(showcase, names[0], names[-1], _say)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
    except LoraserveError as exc:
        sys.stderr.write(f"run: {exc.message}\n")
        return 2
    # The servers log to their files; here only what needs attention, unless asked.
    logging.basicConfig(
        level=logging.INFO if settings.echo_logs else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # The embedded S3 endpoint would log every request the store makes.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())

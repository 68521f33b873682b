"""The whole stack on one machine: object storage, the adapter store, the inference
service, and (for the demo) the demo model and adapters.

`bring_up` starts the parts in dependency order and returns once both servers are
SERVING; `shut_down` stops them in reverse order. Any server exiting on its own is
reported through `exited`, so the supervisor can stop the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from loraserve.common.errors import DeadlineExceeded, FailedPrecondition, Unavailable
from loraserve.demo.embedded_s3 import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, EmbeddedS3
from loraserve.demo.processes import ChildProcess, python_module
from loraserve.demo.publish import is_serving, push_directory, wait_until_routed
from loraserve.demo.settings import RunSettings
from loraserve.demo.showcase import SWAP_ADAPTER
from loraserve.tiny.demo_model import VOICES, DemoBuild, demo_layout, is_demo_built

log = logging.getLogger(__name__)

_HEALTH_POLL_S = 0.5


@dataclass
class Endpoints:
    """What is running where, once `bring_up` has returned."""

    model: str
    s3_endpoint: str | None
    bucket: str
    store_address: str
    inference_address: str
    logs: dict[str, Path] = field(default_factory=dict)
    demo: DemoBuild | None = None
    # Adapter name -> the revision the stack published.
    published: dict[str, int] = field(default_factory=dict)


class Stack:
    """Owns every process and server the run command starts."""

    def __init__(self, settings: RunSettings, echo: TextIO | None, say: Callable[[str], None]):
        self._settings = settings
        self._echo = echo
        self._say = say
        self._s3 = EmbeddedS3()
        self._s3_running = False
        self._children: list[ChildProcess] = []
        self._servers: list[ChildProcess] = []
        self._watchers: list[asyncio.Task[None]] = []
        # Set when a server exits on its own.
        self.exited = asyncio.Event()

    async def bring_up(self) -> Endpoints:
        settings = self._settings
        demo: DemoBuild | None = None
        model = settings.model
        if model is None:
            demo = await self._build_demo()
            model = str(demo.model_dir)
        store_port = settings.store_port or _free_port(settings.host)
        inference_port = settings.inference_port or _free_port(settings.host)
        store_address = f"{settings.host}:{store_port}"
        inference_address = f"{settings.host}:{inference_port}"
        s3_endpoint = settings.s3.endpoint
        store_env = dict(os.environ)
        if s3_endpoint is None:
            embedded = await asyncio.to_thread(self._s3.start, settings.s3.bucket)
            self._s3_running = True
            s3_endpoint = embedded.url
            store_env |= {
                "ADAPTERSTORE_ACCESS_KEY_ID": ACCESS_KEY_ID,
                "ADAPTERSTORE_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
                "ADAPTERSTORE_REGION": REGION,
            }
        endpoints = Endpoints(
            model=model,
            s3_endpoint=s3_endpoint,
            bucket=settings.s3.bucket,
            store_address=store_address,
            inference_address=inference_address,
            demo=demo,
        )
        grace = f"{settings.stop_timeout_s / 2:g}"
        store_argv = [
            f"--listen={store_address}",
            f"--s3-endpoint={s3_endpoint}",
            f"--bucket={settings.s3.bucket}",
            f"--prefix={settings.s3.prefix}",
            f"--shutdown-grace={grace}",
            *([f"--region={settings.s3.region}"] if settings.s3.region else []),
            *settings.store_args,
        ]
        store = await self._start_server(
            "adapterstore", python_module("loraserve.adapterstore", "serve", *store_argv), store_env
        )
        endpoints.logs[store.name] = store.log_path
        self._say(f"adapter store starting on {store_address} (log: {store.log_path})")
        await self._wait_serving(store, store_address)
        if demo is not None and settings.publish_demo_adapters:
            # Published before the inference service starts, so that it loads them at
            # start-up instead of one by one from events.
            endpoints.published = await self._publish_demo(demo, store_address)
        inference_env = dict(os.environ)
        # The demo model needs little KV cache; vLLM's CPU default would take 4 GiB.
        if demo is not None:
            inference_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        inference_argv = [
            f"--model={model}",
            f"--store={store_address}",
            f"--listen={inference_address}",
            f"--adapter-cache={settings.state_dir.absolute() / 'adapter-cache'}",
            f"--shutdown-grace={grace}",
            *settings.inference_args,
        ]
        inference = await self._start_server(
            "inference",
            python_module("loraserve.inference", "serve", *inference_argv),
            inference_env,
        )
        endpoints.logs[inference.name] = inference.log_path
        self._say(
            f"inference service starting on {inference_address}: the engine takes a while "
            f"(log: {inference.log_path})"
        )
        await self._wait_serving(inference, inference_address)
        if endpoints.published:
            await wait_until_routed(
                inference_address,
                settings.client_security,
                endpoints.published,
                settings.ready_timeout_s,
            )
        return endpoints

    async def shut_down(self, force: asyncio.Event) -> None:
        """Stops every child, newest first, then the embedded S3 endpoint."""
        for child in reversed(self._children):
            await self._stop(child, force)
        if self._s3_running:
            await asyncio.to_thread(self._s3.stop)
            self._s3_running = False

    def leftover_pids(self) -> list[int]:
        return [c.pid for c in self._children if c.pid is not None and c.returncode is None]

    async def _stop(self, child: ChildProcess, force: asyncio.Event) -> None:
        stopping = asyncio.create_task(child.stop(self._settings.stop_timeout_s))
        forced = asyncio.create_task(force.wait())
        await asyncio.wait({stopping, forced}, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if not stopping.done():
            stopping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
            await child.stop(0.0)
        code = child.returncode
        log.info("run.child_stopped name=%s code=%s", child.name, code)

    async def _build_demo(self) -> DemoBuild:
        cache_dir = self._settings.cache_dir
        if not await asyncio.to_thread(is_demo_built, cache_dir):
            self._say(
                "training the demo model and adapters on the CPU "
                "(first run only, about two minutes; cached under "
                f"{cache_dir})..."
            )
            trainer = ChildProcess(
                "train",
                python_module("loraserve.tiny", "demo", str(cache_dir)),
                self._settings.state_dir / "train.log",
                echo=self._echo,
            )
            self._children.append(trainer)
            await trainer.start()
            code = await trainer.wait()
            self._children.remove(trainer)
            if code != 0:
                raise FailedPrecondition(
                    f"training the demo model failed (exit status {code}); "
                    f"see {trainer.log_path}:\n  " + "\n  ".join(trainer.tail())
                )
        return demo_layout(cache_dir)

    async def _start_server(
        self, name: str, argv: list[str], env: Mapping[str, str]
    ) -> ChildProcess:
        child = ChildProcess(
            name, argv, self._settings.state_dir / f"{name}.log", env=env, echo=self._echo
        )
        self._children.append(child)
        self._servers.append(child)
        await child.start()
        self._watchers.append(asyncio.create_task(self._watch(child), name=f"{name}-watch"))
        return child

    async def _watch(self, child: ChildProcess) -> None:
        await child.wait()
        self.exited.set()

    def dead_server(self) -> ChildProcess | None:
        """The first server that has exited, if any."""
        return next((c for c in self._servers if c.returncode is not None), None)

    async def _wait_serving(self, child: ChildProcess, address: str) -> None:
        deadline = time.monotonic() + self._settings.ready_timeout_s
        while not await is_serving(address, self._settings.client_security):
            if child.returncode is not None:
                raise Unavailable(f"{child.name} exited with status {child.returncode}")
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"{child.name} did not report SERVING within "
                    f"{self._settings.ready_timeout_s:.0f} s; see {child.log_path}"
                )
            await asyncio.sleep(_HEALTH_POLL_S)
        log.info("run.serving name=%s address=%s", child.name, address)

    async def _publish_demo(self, demo: DemoBuild, store_address: str) -> dict[str, int]:
        security = self._settings.client_security
        published: dict[str, int] = {}
        for name, directory in demo.adapters.items():
            published[name] = await push_directory(
                store_address, security, name, directory, description=f"demo voice: {name}"
            )
        first = VOICES[0].name
        published[SWAP_ADAPTER] = await push_directory(
            store_address,
            security,
            SWAP_ADAPTER,
            demo.adapters[first],
            description=f"demo: starts as the {first}",
        )
        self._say(
            "published demo adapters: "
            + ", ".join(f"{name}@{rev}" for name, rev in published.items())
        )
        return published


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])

"""The short how-to the run command prints once everything is up."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from loraserve.demo.settings import DEFAULT_INFERENCE_PORT, DEFAULT_STORE_PORT, RunSettings
from loraserve.demo.showcase import PROMPT, SWAP_ADAPTER
from loraserve.demo.stack import Endpoints


def adapterctl_command() -> str:
    """How to type adapterctl here: the one beside this interpreter, relative if shorter."""
    path = Path(sys.executable).parent / "adapterctl"
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return relative if len(relative) < len(str(path)) else str(path)


def howto(settings: RunSettings, endpoints: Endpoints) -> str:
    ctl = adapterctl_command()
    defaults = (
        endpoints.store_address.endswith(f":{DEFAULT_STORE_PORT}")
        and endpoints.inference_address.endswith(f":{DEFAULT_INFERENCE_PORT}")
        and settings.host in ("127.0.0.1", "localhost")
    )
    storage = f"{endpoints.s3_endpoint} bucket {endpoints.bucket}"
    if settings.s3.embedded:
        storage += " (embedded, in memory: gone on exit)"
    lines = [
        "",
        "loraserve is running:",
        f"  model              {endpoints.model}",
        f"  S3                 {storage}",
        f"  adapter store      {endpoints.store_address}   log: {endpoints.logs['adapterstore']}",
        f"  inference service  {endpoints.inference_address}   log: {endpoints.logs['inference']}",
        "",
        "Try it from another terminal:",
    ]
    if not defaults:
        lines.append(
            f"  export ADAPTERSTORE_ADDR={endpoints.store_address} "
            f"INFERENCE_ADDR={endpoints.inference_address}"
        )
    prompt = shlex.quote(PROMPT)
    if endpoints.demo is not None and endpoints.published:
        voices = [name for name in endpoints.demo.adapters]
        first, last = voices[0], voices[-1]
        last_dir = shlex.quote(os.path.relpath(endpoints.demo.adapters[last]))
        lines += [
            f"  {ctl} list",
            f"  {ctl} generate {first} {prompt} --max-tokens 40 --temperature 0",
            f"  {ctl} generate {voices[1]} {prompt} --max-tokens 40 --temperature 0",
            f"  {ctl} generate --base {prompt} --max-tokens 40 --temperature 0",
            f"  {ctl} push {first} {last_dir}    # {first}@2 now answers as the {last}",
            f"  {ctl} generate {first} {prompt} --max-tokens 40 --temperature 0",
            f"  {ctl} rollback {first} 1",
            f"  {ctl} status {first}",
            f"  ({SWAP_ADAPTER} is the adapter the showcase pushed over while it streamed.)",
        ]
    else:
        lines += [
            f"  {ctl} push NAME ADAPTER_DIR     # adapter_config.json + adapter_model.safetensors",
            f"  {ctl} generate NAME {prompt} --max-tokens 40",
            f"  {ctl} list",
        ]
    lines += ["", "Ctrl-C stops everything."]
    return "\n".join(lines)

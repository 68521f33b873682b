"""vLLM's own command-line flags for the engine loraserve runs: the baselines (`vllm
serve`, vLLM's gRPC server, AsyncLLM used directly) take exactly these, derived from the
same `inference serve` flags through loraserve's settings object, so that the engine
settings of the competitor arms cannot drift from ours."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

# Chosen by vLLM from the hardware, or the engine's own identity: the same on both
# sides without being passed.
_SKIPPED = frozenset({"model"})
# loraserve's own additions to the engine (its adapter preloader): plain vLLM, the
# baseline, runs without them.
_OURS_ONLY = frozenset({"worker_extension_cls"})


def loraserve_engine_args(serve_argv: Sequence[str]) -> Any:
    """The `AsyncEngineArgs` `inference serve SERVE_ARGV` builds its engine with."""
    from loraserve.inference.engine import engine_args
    from loraserve.inference.settings import parse_settings

    return engine_args(parse_settings(list(serve_argv), os.environ, "bench").engine)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _value(value: object) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def vllm_flags(engine_args: Any) -> list[str]:
    """`--model M` plus a flag for every engine argument that differs from vLLM's default."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    defaults = AsyncEngineArgs(model=engine_args.model)
    flags = [_flag("model"), str(engine_args.model)]
    for field in dataclasses.fields(AsyncEngineArgs):
        value = getattr(engine_args, field.name)
        if field.name in _SKIPPED | _OURS_ONLY or value == getattr(defaults, field.name):
            continue
        if isinstance(value, bool):
            flags.append(_flag(field.name) if value else "--no-" + field.name.replace("_", "-"))
        else:
            flags += [_flag(field.name), _value(value)]
    return flags


def parse_vllm_flags(flags: Sequence[str]) -> Any:
    """The `AsyncEngineArgs` vLLM's servers build from FLAGS (what they will run with)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser_class: Any = FlexibleArgumentParser
    parser = AsyncEngineArgs.add_cli_args(parser_class())
    return AsyncEngineArgs.from_cli_args(parser.parse_args(list(flags)))


def differences(ours: Any, theirs: Any) -> dict[str, tuple[object, object]]:
    """Engine arguments that differ between two `AsyncEngineArgs`: name -> (ours, theirs),
    leaving out loraserve's own additions."""
    return {
        f.name: (getattr(ours, f.name), getattr(theirs, f.name))
        for f in dataclasses.fields(ours)
        if f.name not in _OURS_ONLY and getattr(ours, f.name) != getattr(theirs, f.name)
    }

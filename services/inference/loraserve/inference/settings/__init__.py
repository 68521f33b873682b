"""The inference service's one settings object, parsed once from flags with env fallbacks.

Every flag falls back to `INFERENCE_<FLAG>` in the environment (dashes as underscores),
so a container can be configured without a command line.
"""

from loraserve.inference.settings.flags import build_parser, parse_engine_arg, parse_settings
from loraserve.inference.settings.options import (
    DEFAULT_MAX_N,
    DEFAULT_OPENAI_MAX_BODY_BYTES,
    ENV_PREFIX,
    CompatOptions,
    EngineOptions,
    InferenceSettings,
)

__all__ = [
    "DEFAULT_MAX_N",
    "DEFAULT_OPENAI_MAX_BODY_BYTES",
    "ENV_PREFIX",
    "CompatOptions",
    "EngineOptions",
    "InferenceSettings",
    "build_parser",
    "parse_engine_arg",
    "parse_settings",
]

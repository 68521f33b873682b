"""Tests of the native transport run where it is built (`make setup`), and are skipped,
saying why, where it is not; except where `.ci/run` built it (`make native` succeeded):
there a native transport that does not load fails its tests instead of skipping them."""

from __future__ import annotations

import os

import pytest

from loraserve.inference.transport import load_native

# Set by `.ci/run` once `make native` built the transport.
REQUIRED = os.environ.get("LORASERVE_REQUIRE_NATIVE") == "1"


def _unbuilt() -> str:
    """Why the native transport cannot load here; "" where it can."""
    try:
        load_native()
    except ImportError as exc:
        return str(exc)
    return ""


UNBUILT = _unbuilt()

native_only = pytest.mark.skipif(bool(UNBUILT) and not REQUIRED, reason=UNBUILT)

"""Tests of the native transport run where it is built (`make setup`), and are skipped,
saying why, where it is not."""

from __future__ import annotations

import pytest

from loraserve.inference.transport import load_native


def _unbuilt() -> str:
    """Why the native transport cannot load here; "" where it can."""
    try:
        load_native()
    except ImportError as exc:
        return str(exc)
    return ""


UNBUILT = _unbuilt()

native_only = pytest.mark.skipif(bool(UNBUILT), reason=UNBUILT)

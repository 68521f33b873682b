"""Microbenchmarks outside `python -m bench`: the cost of one code path per request,
measured against the same loop without it, side by side in one process (tracing_off)."""

__all__ = ["tracing_off"]

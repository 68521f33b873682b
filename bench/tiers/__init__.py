"""Benchmark 11, thousands of adapters per replica (thousands): its rig and its figures."""

__all__ = [
    "figures",
    "rig",
    "thousands",
]

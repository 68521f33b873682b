"""The load generator, in a process of its own (loadgen, driven by loadclient): the
workloads, the steady-state loops (drive), what it drives (targets) and the ways it
calls a server (calls; thin: an engine with nothing of a server in between)."""

__all__ = [
    "calls",
    "drive",
    "loadclient",
    "loadgen",
    "targets",
    "thin",
    "workload",
]

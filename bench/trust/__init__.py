"""The `--profile trust` benchmarks (suite): 19 fair admission under a flood, 20 what
signature verification costs (issue 26)."""

__all__ = [
    "suite",
]

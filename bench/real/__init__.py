"""The `--profile real` benchmarks (suite): the real-size model and adapters (models),
15 a fleet cold start (fleet_caches, each member a fleet_fetch process), 18 a load's
effect on running streams (load_stall); 14, 16 and 17 reuse the store and swap arms."""

__all__ = [
    "fleet_caches",
    "fleet_fetch",
    "load_stall",
    "models",
    "suite",
]

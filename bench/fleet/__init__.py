"""Benchmarks on several replicas: 10 routing by adapter (routing), 22 canary rollouts
(rollout, rollout_figures), on the fleet rig (rig)."""

__all__ = [
    "rig",
    "rollout",
    "rollout_figures",
    "routing",
]

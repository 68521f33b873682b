"""Benchmarks on several replicas: 10 routing by adapter (routing, its replica SIGKILLed:
failover), 22 canary rollouts (rollout, rollout_figures), on the fleet rig (rig); and
placement's stability simulated without servers (placement_sim)."""

__all__ = [
    "failover",
    "placement_sim",
    "rig",
    "rollout",
    "rollout_figures",
    "routing",
]

"""adapterctl's commands, each module imported only when one of its commands runs
(start-up is part of every push's latency): reads, writes, rollouts, quotas, yanks,
generate, the fleet wait after a write, signed and watched pushes, hashing a directory
to push."""

__all__ = [
    "fleet_wait",
    "generate",
    "push",
    "quota",
    "read",
    "rollout",
    "signed_push",
    "watch_dir",
    "write",
    "yank",
]

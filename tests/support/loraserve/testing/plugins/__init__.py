"""Pytest plugins for the whole session: the order modules reach xdist's workers, the
figures a run reports at its end, the demo model trained in the background."""

__all__ = ["demo_warmup", "figures", "scheduling"]

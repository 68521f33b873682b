"""Command-line pieces both services share: flags with environment fallbacks, byte sizes,
bounds on stored text, fair admission's settings."""

__all__ = ["admission", "flags", "sizes", "textlimits"]

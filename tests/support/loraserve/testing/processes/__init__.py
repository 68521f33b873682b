"""Real child processes: `adapterstore serve` and `inference serve`, a fleet of them, and a
TCP proxy a test can cut."""

__all__ = ["fleet", "services", "tcpproxy"]

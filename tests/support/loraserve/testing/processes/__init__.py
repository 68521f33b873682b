"""Real child processes: `adapterstore serve` and `inference serve`, a fleet of them, a
pair of replicas behind HAProxy, and a TCP proxy a test can cut."""

__all__ = ["fleet", "routed", "services", "tcpproxy"]

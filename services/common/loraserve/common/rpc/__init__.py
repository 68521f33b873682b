"""What both servers and their clients share on the wire: the servers' start and stop,
tokens, roles and identities, TLS (renewed in place), protected mode, the one mapping of
domain errors to statuses, client streams that report the server's status, health
checks, retries and backoff, the metrics endpoint and the sampling fields the contract
marks optional."""

__all__ = [
    "auth",
    "backoff",
    "clientstream",
    "grpcutil",
    "healthcheck",
    "metrics_http",
    "protected",
    "retrylog",
    "sampling_fields",
    "security",
    "server",
    "tlsfiles",
]

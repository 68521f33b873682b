"""The adapter store for tests: stores on fake or real blobs, its gRPC server, short-hand
calls, and replica statuses in bulk."""

__all__ = ["calls", "server", "statuses", "stores"]

"""Object storage over real HTTP: moto's server and a bucket per test, a fault-injecting
proxy in front of it, multipart part counts, and writes into a bucket around the store."""

__all__ = ["aroundstore", "endpoint", "faults", "forgery", "partcount", "process"]

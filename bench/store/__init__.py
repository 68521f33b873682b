"""The adapter store's benchmarks: 6 transfers and events (transfers_events, with the
transfer arms of transfers), 12 the store at 10,000 adapters (thousands), 21 S3 client
libraries (s3_libs)."""

__all__ = [
    "s3_libs",
    "thousands",
    "transfers",
    "transfers_events",
]

"""Tools for the engineer working on a serving front, outside `python -m bench`: the
front's cost per token (stream_probe, openai_front; spy_summary sums a py-spy profile)
and the floor under it with no engine (grpc_floor, its servers and HTTP/2 variants)."""

__all__ = [
    "grpc_floor",
    "grpc_floor_h2",
    "grpc_floor_servers",
    "openai_front",
    "spy_summary",
    "stream_probe",
]

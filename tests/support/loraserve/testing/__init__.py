"""Pytest fixtures and helpers on real parts, by what they hold: `s3` (object storage over
HTTP), `store` and `inference` (the services in-process), `engine` (the session's vLLM
engine), `processes` (the services as child processes), `adapters` (what tests push),
`fakes` (in-memory stand-ins for unit tests of logic), `plugins` (session-wide pytest
hooks); `grpc`, `streams`, `certs` and `waiting` serve them all."""

__all__ = [
    "adapters",
    "certs",
    "engine",
    "fakes",
    "grpc",
    "inference",
    "plugins",
    "processes",
    "s3",
    "store",
    "streams",
    "waiting",
]

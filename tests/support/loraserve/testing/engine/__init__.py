"""The session's real vLLM engine on the tiny model: its fixture, what it has done by
vLLM's own count, an engine that holds requests, and the PEFT oracle and parity checks
against it."""

__all__ = ["holding", "oracle", "parity", "session", "work"]

"""The inference service for tests: on the session's engine without the store, as a whole
app with store sync, the OpenAI front on a fake engine, the whole stack, and `inference
serve` with injected faults."""

__all__ = ["app", "faulty", "openai_front", "service", "stack"]

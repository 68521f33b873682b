"""The inference benchmarks on one shared stack (suite runs them in order, with the
swap benchmarks 4 and 5): 1-3 throughput, 7 memory, 8 against vLLM, 13 the stream."""

__all__ = [
    "against_vllm",
    "memory",
    "stream",
    "suite",
    "throughput",
]

"""New weights reaching the engine: 4 hot swap under load (hot, hot_figures), 5 the cold
first request (cold), 9 loraserve's swap vs vLLM's own (vs_vllm, with its arms and the
probe that tells new weights from old; the real profile's 16 and 17 use them too)."""

__all__ = [
    "arms",
    "cold",
    "hot",
    "hot_figures",
    "probe",
    "vs_vllm",
]

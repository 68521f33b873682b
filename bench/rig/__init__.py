"""What the benchmarks run on and against: the processes (procs: moto's S3 server,
`adapterstore serve`, `inference serve`), the shared stack, the store as users reach it
(storeops), adapters with new weights (variants), engine A's host (engine_host,
engine_callers) and vLLM's own servers on loraserve's engine settings (baselines,
vllm_args, raw_engine)."""

__all__ = [
    "baselines",
    "engine_callers",
    "engine_host",
    "procs",
    "raw_engine",
    "stack",
    "storeops",
    "variants",
    "vllm_args",
]

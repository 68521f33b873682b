"""The inference service's Prometheus metrics, and the model-server gauges of the
Gateway API Inference Extension (vLLM's names)."""

from loraserve.inference.metrics.inference_metrics import InferenceMetrics

__all__ = ["InferenceMetrics"]

"""The inference service's Prometheus metrics, and the model-server gauges of the
Gateway API Inference Extension (vLLM's names)."""

from loraserve.inference.metrics.inference_metrics import InferenceMetrics
from loraserve.inference.metrics.rollout_metrics import TTFT_BOUNDS_S, RolloutMeter

__all__ = ["TTFT_BOUNDS_S", "InferenceMetrics", "RolloutMeter"]

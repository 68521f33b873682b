"""`inference serve`'s tracing flags: off by default, on with the flag or its
`INFERENCE_` variable, sampling and principals as asked, bad values refused."""

from __future__ import annotations

import pytest

from loraserve.common.errors import InvalidArgument
from loraserve.common.tracing import TracingSettings
from loraserve.inference.settings import parse_settings

BASE = ["serve", "--model", "/models/tiny", "--store", "store:50051"]


def test_tracing_is_off_without_an_endpoint() -> None:
    assert parse_settings(BASE, {}, "host-1").tracing == TracingSettings()


def test_tracing_flags_reach_the_settings() -> None:
    settings = parse_settings(
        [*BASE, "--otlp-traces-endpoint", "http://collector:4317", "--trace-sample-ratio",
         "0.25", "--trace-principals"],
        {},
        "host-1",
    )  # fmt: skip
    assert settings.tracing == TracingSettings("http://collector:4317", 0.25, True)


def test_tracing_endpoint_falls_back_to_inference_env() -> None:
    environ = {"INFERENCE_OTLP_TRACES_ENDPOINT": "https://collector:4317"}
    assert parse_settings(BASE, environ, "host-1").tracing.endpoint == "https://collector:4317"


def test_trace_sample_ratio_above_one_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="--trace-sample-ratio must be between 0 and 1"):
        parse_settings([*BASE, "--trace-sample-ratio", "2"], {}, "host-1")

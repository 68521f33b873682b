"""`adapterstore serve`'s tracing flags: off by default, on with the flag, its
`ADAPTERSTORE_` variable or OpenTelemetry's own, and bad values refused."""

from __future__ import annotations

import io
from contextlib import redirect_stderr

import pytest

from loraserve.adapterstore.__main__ import main
from loraserve.adapterstore.settings import parse_settings
from loraserve.common.errors import InvalidArgument
from loraserve.common.tracing import TracingSettings

SERVE = ["serve", "--bucket", "adapters"]


def test_tracing_is_off_without_an_endpoint() -> None:
    assert parse_settings(SERVE, {}).tracing == TracingSettings()


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--otlp-traces-endpoint", "http://collector:4317"], {}),
        ([], {"ADAPTERSTORE_OTLP_TRACES_ENDPOINT": "http://collector:4317"}),
        ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}),
    ],
)
def test_tracing_endpoint_comes_from_flag_or_environment(
    argv: list[str], environ: dict[str, str]
) -> None:
    assert parse_settings([*SERVE, *argv], environ).tracing.endpoint == "http://collector:4317"


def test_trace_sample_ratio_above_one_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="--trace-sample-ratio must be between 0 and 1"):
        parse_settings([*SERVE, "--trace-sample-ratio", "2"], {})


def test_serve_exits_2_naming_a_bad_sample_ratio() -> None:
    stderr = io.StringIO()
    with redirect_stderr(stderr):
        code = main([*SERVE, "--trace-sample-ratio", "2"])
    assert code == 2
    assert "--trace-sample-ratio" in stderr.getvalue()


def test_an_endpoint_that_is_no_url_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="http://HOST:PORT"):
        parse_settings([*SERVE, "--otlp-traces-endpoint", "collector:4317"], {})

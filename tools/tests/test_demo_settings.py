"""The run command's flags: the demo by default, a real model and storage on request."""

from __future__ import annotations

import pytest

from loraserve.common.errors import InvalidArgument
from loraserve.demo.settings import DEFAULT_INFERENCE_PORT, DEFAULT_STORE_PORT, parse_settings


def test_no_flags_run_the_demo_with_embedded_storage() -> None:
    settings = parse_settings([], {})
    assert settings.model is None
    assert settings.s3.embedded
    assert settings.publish_demo_adapters
    assert settings.showcase
    assert settings.store_address == f"127.0.0.1:{DEFAULT_STORE_PORT}"
    assert settings.inference_address == f"127.0.0.1:{DEFAULT_INFERENCE_PORT}"


def test_a_given_model_serves_without_demo_adapters() -> None:
    settings = parse_settings(["--model", "/models/llama", "--s3-endpoint", "http://s3:9000"], {})
    assert settings.model == "/models/llama"
    assert settings.s3.endpoint == "http://s3:9000"
    assert not settings.publish_demo_adapters
    assert not settings.showcase


def test_model_and_endpoint_fall_back_to_the_environment() -> None:
    env = {"LORASERVE_MODEL": "/m", "LORASERVE_S3_ENDPOINT": "http://s3", "LORASERVE_BUCKET": "b"}
    settings = parse_settings([], env)
    assert (settings.model, settings.s3.endpoint, settings.s3.bucket) == ("/m", "http://s3", "b")


def test_demo_adapters_with_another_model_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="demo model"):
        parse_settings(["--model", "/models/llama", "--demo-adapters"], {})


def test_showcase_without_demo_adapters_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="demo adapters"):
        parse_settings(["--no-demo-adapters", "--showcase"], {})


def test_server_arguments_pass_through_in_order() -> None:
    settings = parse_settings(
        ["--inference-arg=--max-loras=8", "--inference-arg=--dtype=float32"], {}
    )
    assert settings.inference_args == ("--max-loras=8", "--dtype=float32")

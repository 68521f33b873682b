"""`inference serve` flags, their env fallbacks and the engine-argument passthrough."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.common.errors import InvalidArgument
from loraserve.inference.engine import engine_args
from loraserve.inference.settings import parse_settings

BASE = ["serve", "--model", "/models/Llama-3-8B", "--store", "store:50051"]


def test_engine_flags_reach_the_engine_options() -> None:
    settings = parse_settings(
        [*BASE, "--max-loras", "8", "--max-lora-rank", "64", "--max-cpu-loras", "32",
         "--gpu-memory-utilization", "0.8", "--max-model-len", "4096", "--dtype", "bfloat16",
         "--lora-dtype", "float16", "--cpu-offload-gb", "2"],
        {},
        "host-1",
    )  # fmt: skip

    engine = settings.engine
    assert (engine.max_loras, engine.max_lora_rank, engine.max_cpu_loras) == (8, 64, 32)
    assert (engine.gpu_memory_utilization, engine.max_model_len) == (0.8, 4096)
    assert (engine.dtype, engine.lora_dtype, engine.cpu_offload_gb) == ("bfloat16", "float16", 2)
    assert settings.replica_id == "host-1"
    assert settings.compat.served_model_name == "Llama-3-8B"


def test_flags_fall_back_to_inference_env() -> None:
    environ = {
        "INFERENCE_MODEL": "/m/tiny",
        "INFERENCE_STORE": "s:1",
        "INFERENCE_MAX_LORAS": "3",
        "INFERENCE_ADAPTER_CACHE": "/var/cache/adapters",
        "INFERENCE_STORE_TOKEN": "sekret",
        "INFERENCE_ENGINE_ARGS": "enforce_eager=true;seed=7",
    }
    settings = parse_settings(["serve"], environ, "h")

    assert settings.engine.model == "/m/tiny"
    assert settings.engine.max_loras == 3
    assert settings.adapter_cache == Path("/var/cache/adapters")
    assert settings.store_security.token == "sekret"
    assert dict(settings.engine.extra) == {"enforce_eager": True, "seed": 7}


def test_max_lora_rank_auto_is_none() -> None:
    settings = parse_settings([*BASE, "--max-lora-rank", "auto"], {}, "h")
    assert settings.engine.max_lora_rank is None


def test_engine_arg_values_are_json_or_strings() -> None:
    settings = parse_settings(
        [*BASE, "--engine-arg", "max_num_seqs=64", "--engine-arg", "kv-cache-dtype=fp8"], {}, "h"
    )
    assert dict(settings.engine.extra) == {"max_num_seqs": 64, "kv_cache_dtype": "fp8"}


def test_cpu_loras_below_max_loras_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="--max-cpu-loras"):
        parse_settings([*BASE, "--max-loras", "8", "--max-cpu-loras", "4"], {}, "h")


def test_passthrough_builds_vllm_engine_args() -> None:
    settings = parse_settings([*BASE, "--engine-arg", "enforce_eager=true"], {}, "h")
    args = engine_args(settings.engine)
    assert (args.enable_lora, args.enforce_eager, args.model) == (True, True, "/models/Llama-3-8B")
    assert args.worker_extension_cls == "loraserve.inference.engine.lora_preload.LoraPreloader"


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("max_loras=2", "--max-loras"),
        ("no_such_thing=1", "no engine argument"),
        ("worker_extension_cls=my.Extension", "set by loraserve"),
    ],
)
def test_passthrough_refuses_managed_and_unknown_keys(item: str, message: str) -> None:
    settings = parse_settings([*BASE, "--engine-arg", item], {}, "h")
    with pytest.raises(InvalidArgument, match=message):
        engine_args(settings.engine)


def test_admission_flags_fall_back_to_env_and_default_to_fair() -> None:
    default = parse_settings(BASE, {}, "h").admission
    assert (default.fair, default.headroom) == (True, 2)
    environ = {
        "INFERENCE_ADMISSION_ORDER": "fifo",
        "INFERENCE_MAX_ENGINE_REQUESTS": "4",
        "INFERENCE_FAIR_HEADROOM": "0",
        "INFERENCE_ADAPTER_WEIGHTS": "gold=3, bronze=0.5",
    }
    admission = parse_settings(BASE, environ, "h").admission
    assert (admission.fair, admission.max_engine_requests, admission.headroom) == (False, 4, 0)
    assert dict(admission.weights) == {"gold": 3.0, "bronze": 0.5}


def test_lora_slots_are_left_to_the_engine_unless_turns_are_asked_for() -> None:
    assert parse_settings(BASE, {}, "h").admission.slot_turns is False
    turns = {"INFERENCE_LORA_SLOT_ORDER": "turns"}
    assert parse_settings(BASE, turns, "h").admission.slot_turns is True


@pytest.mark.parametrize("weights", ["gold", "gold=0", "gold=-1", "gold=lots", "=2"])
def test_an_adapter_weight_that_is_not_a_positive_number_is_a_usage_error(
    weights: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_settings([*BASE, "--adapter-weights", weights], {}, "h")
    assert "NAME=WEIGHT with a positive number" in capsys.readouterr().err


def test_a_negative_fair_headroom_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings([*BASE, "--fair-headroom", "-1"], {}, "h")
    assert "--fair-headroom" in capsys.readouterr().err


def test_grpc_transport_defaults_to_auto() -> None:
    assert parse_settings(BASE, {}, "host").grpc_transport == "auto"


def test_a_grpc_transport_from_the_environment_that_is_no_choice_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_settings(BASE, {"INFERENCE_GRPC_TRANSPORT": "grpc"}, "host")
    assert "--grpc-transport: invalid choice from the environment: 'grpc'" in (
        capsys.readouterr().err
    )

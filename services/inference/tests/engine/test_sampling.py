"""The one mapping of sampling options onto vLLM's SamplingParams, and vLLM's server rules.

No engine: vLLM's SamplingParams and ModelConfig are plain objects. The real engine's
answers for each option are in tests/test_generation_parity.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from loraserve.clients.inference import Sampling
from loraserve.common.errors import InvalidArgument
from loraserve.inference.engine.sampling import (
    DEFAULTED_FIELDS,
    SamplingRequest,
    ServerDefaults,
    StructuredOutput,
    resolve_max_tokens,
    vllm_sampling_params,
)
from loraserve.inference.serving.servicer import sampling_request
from loraserve.inference.v1 import inference_pb2 as pb

NO_DEFAULTS = ServerDefaults()


def test_defaulted_fields_are_vllm_servers() -> None:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    vllms: object = CompletionRequest.__private_attributes__["_DEFAULT_SAMPLING_PARAMS"].default
    assert vllms == DEFAULTED_FIELDS


@pytest.mark.parametrize(
    ("request_fields", "attribute", "expected"),
    [
        ({"presence_penalty": 0.5}, "presence_penalty", 0.5),
        ({"frequency_penalty": -0.5}, "frequency_penalty", -0.5),
        ({"repetition_penalty": 1.3}, "repetition_penalty", pytest.approx(1.3)),
        ({"min_p": 0.25}, "min_p", 0.25),
        ({"min_tokens": 3}, "min_tokens", 3),
        ({"stop_token_ids": (13, 14)}, "stop_token_ids", [13, 14]),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output", True),
        ({"skip_special_tokens": False}, "skip_special_tokens", False),
        ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens", False),
        ({"logit_bias": {5: 250.0}}, "logit_bias", {5: 100.0}),
        ({"bad_words": ("fox",)}, "bad_words", ["fox"]),
        ({"logprobs": 3}, "logprobs", 3),
        ({"prompt_logprobs": 2}, "prompt_logprobs", 2),
        ({"n": 3}, "n", 3),
        ({"seed": 7}, "seed", 7),
        ({"top_k": 5}, "top_k", 5),
        ({"ignore_eos": True}, "ignore_eos", True),
        ({"stop": ("\n",)}, "stop", ["\n"]),
        ({"stream_interval": 4}, "stream_interval", 4),
    ],
)
def test_each_option_reaches_vllms_sampling_params(
    request_fields: dict[str, Any], attribute: str, expected: object
) -> None:
    params = vllm_sampling_params(SamplingRequest(**request_fields), 8, NO_DEFAULTS)
    assert getattr(params, attribute) == expected


@pytest.mark.parametrize(
    ("structured", "attribute", "expected"),
    [
        (StructuredOutput(json='{"type": "object"}'), "json", '{"type": "object"}'),
        (StructuredOutput(regex="[ab]+"), "regex", "[ab]+"),
        (StructuredOutput(choice=("yes", "no")), "choice", ["yes", "no"]),
        (StructuredOutput(grammar='root ::= "a"'), "grammar", 'root ::= "a"'),
        (StructuredOutput(json_object=True), "json_object", True),
    ],
)
def test_structured_output_reaches_vllms_params(
    structured: StructuredOutput, attribute: str, expected: object
) -> None:
    params = vllm_sampling_params(SamplingRequest(structured_output=structured), 8, NO_DEFAULTS)
    assert getattr(params.structured_outputs, attribute) == expected


def test_unset_options_take_the_model_defaults_and_set_ones_win() -> None:
    defaults = ServerDefaults({"temperature": 0.25, "top_k": 7, "repetition_penalty": 1.1})
    params = vllm_sampling_params(SamplingRequest(top_k=3), 8, defaults)
    assert (params.temperature, params.top_k) == (0.25, 3)
    assert params.repetition_penalty == pytest.approx(1.1)


def test_a_prompt_that_leaves_less_room_than_max_tokens_gets_what_fits() -> None:
    assert resolve_max_tokens(16, prompt_tokens=250, max_model_len=256, defaults=NO_DEFAULTS) == 6


def test_unset_max_tokens_runs_to_the_end_of_the_context() -> None:
    assert resolve_max_tokens(None, prompt_tokens=10, max_model_len=256, defaults=NO_DEFAULTS) == (
        246
    )


def test_unset_max_tokens_takes_the_models_max_new_tokens() -> None:
    defaults = ServerDefaults({"max_tokens": 9})
    assert resolve_max_tokens(None, prompt_tokens=10, max_model_len=256, defaults=defaults) == 9


def test_a_prompt_longer_than_the_context_is_invalid_naming_the_prompt() -> None:
    with pytest.raises(InvalidArgument, match="prompt: Input length"):
        resolve_max_tokens(4, prompt_tokens=300, max_model_len=256, defaults=NO_DEFAULTS)


def test_defaults_are_read_from_the_models_generation_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from vllm.config import ModelConfig

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config_path = model / "generation_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config |= {"temperature": 0.25, "top_k": 7, "max_new_tokens": 9}
    config_path.write_text(json.dumps(config), encoding="utf-8")

    defaults = ServerDefaults.of_model(ModelConfig(model=str(model)))
    max_tokens = resolve_max_tokens(None, 5, 64, defaults)
    params = vllm_sampling_params(SamplingRequest(), max_tokens, defaults)

    assert (params.temperature, params.top_k, params.max_tokens) == (0.25, 7, 9)


def test_every_grpc_sampling_field_maps_onto_the_request() -> None:
    message = pb.SamplingParams(
        max_tokens=5,
        temperature=0.5,
        top_p=0.5,
        top_k=4,
        seed=3,
        stop=["x"],
        ignore_eos=True,
        n=2,
        min_p=0.25,
        min_tokens=1,
        presence_penalty=0.125,
        frequency_penalty=0.25,
        repetition_penalty=1.5,
        stop_token_ids=[9],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        logit_bias={7: 1.5},
        bad_words=["fox"],
        logprobs=2,
        prompt_logprobs=1,
        structured_output=pb.StructuredOutput(choice=pb.Choices(values=["a", "b"])),
        stream_interval=4,
    )
    mapped = sampling_request(message)
    # Every proto field has its SamplingRequest twin, so none can be dropped unnoticed.
    proto_fields = {f.name for f in pb.SamplingParams.DESCRIPTOR.fields}
    assert proto_fields == set(SamplingRequest.__dataclass_fields__)
    # float32 on the wire: 0.5, 0.25, 0.125 and 1.5 are exact there.
    assert mapped == SamplingRequest(
        max_tokens=5,
        temperature=0.5,
        top_p=0.5,
        top_k=4,
        seed=3,
        stop=("x",),
        ignore_eos=True,
        n=2,
        min_p=0.25,
        min_tokens=1,
        presence_penalty=0.125,
        frequency_penalty=0.25,
        repetition_penalty=1.5,
        stop_token_ids=(9,),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        logit_bias={7: 1.5},
        bad_words=("fox",),
        logprobs=2,
        prompt_logprobs=1,
        structured_output=StructuredOutput(choice=("a", "b")),
        stream_interval=4,
    )


def test_stream_interval_below_one_is_invalid_naming_the_field() -> None:
    with pytest.raises(InvalidArgument, match=r"sampling\.stream_interval"):
        vllm_sampling_params(SamplingRequest(stream_interval=0), 8, NO_DEFAULTS)


@pytest.mark.parametrize(
    ("structured", "kind"),
    [
        (pb.StructuredOutput(json_schema="{}"), StructuredOutput(json="{}")),
        (pb.StructuredOutput(regex="a+"), StructuredOutput(regex="a+")),
        (pb.StructuredOutput(grammar="g"), StructuredOutput(grammar="g")),
        (pb.StructuredOutput(json_object=True), StructuredOutput(json_object=True)),
    ],
)
def test_each_grpc_structured_output_kind_maps(
    structured: pb.StructuredOutput, kind: StructuredOutput
) -> None:
    assert (
        sampling_request(pb.SamplingParams(structured_output=structured)).structured_output == kind
    )


def test_grpc_structured_output_without_a_kind_is_invalid_naming_it() -> None:
    request = sampling_request(pb.SamplingParams(structured_output=pb.StructuredOutput()))
    with pytest.raises(InvalidArgument, match=r"sampling\.structured_output"):
        vllm_sampling_params(request, 8, NO_DEFAULTS)


def test_the_client_sends_every_option() -> None:
    sampling = Sampling(
        n=2,
        min_p=0.25,
        min_tokens=1,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.5,
        stop_token_ids=(13,),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        logit_bias={7: 1.5},
        bad_words=("fox",),
        logprobs=2,
        prompt_logprobs=1,
        regex="[ab]+",
        stream_interval=3,
    )
    assert sampling_request(sampling.to_proto()) == SamplingRequest(
        n=2,
        min_p=0.25,
        min_tokens=1,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.5,
        stop_token_ids=(13,),
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
        logit_bias={7: 1.5},
        bad_words=("fox",),
        logprobs=2,
        prompt_logprobs=1,
        structured_output=StructuredOutput(regex="[ab]+"),
        stream_interval=3,
    )

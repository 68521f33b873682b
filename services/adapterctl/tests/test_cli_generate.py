"""`adapterctl generate` against a scripted InferenceService on a real gRPC server.

The engine end to end is covered by the inference service's own tests; here the
server plays a fixed script so the CLI's streaming and printing are checked exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from loraserve.adapterctl.cli import run
from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_NOT_ALLOWED
from loraserve.common.errors import NotFound
from loraserve.common.rpc.security import ServerSecurity, parse_tokens
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.ctl import buffers, ctl, output
from loraserve.testing.grpc import serving
from loraserve.testing.waiting import eventually

SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name


class ScriptedInference(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Streams "Hel", then "lo" once `release` is set, then the final message."""

    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []
        self.release = asyncio.Event()
        self.release.set()

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        self.requests.append(request)
        if request.adapter.startswith("ghost"):
            raise NotFound(f"adapter {request.adapter!r} not found")
        name, _, revision = request.adapter.partition("@")
        yield pb.GenerateResponse(
            text="Hel",
            token_ids=[1],
            adapter_name=name,
            revision=int(revision or 3) if name else 0,
            request_id="req-1",
        )
        await self.release.wait()
        yield pb.GenerateResponse(text="lo", token_ids=[2])
        yield pb.GenerateResponse(
            finish_reason=pb.FINISH_REASON_LENGTH,
            usage=pb.Usage(prompt_tokens=4, completion_tokens=2),
        )


@pytest.fixture
async def inference() -> AsyncIterator[tuple[ScriptedInference, dict[str, str]]]:
    servicer = ScriptedInference()

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)

    async with serving(register, [SERVICE]) as server:
        yield servicer, {"INFERENCE_ADDR": f"127.0.0.1:{server.port}"}


async def test_generate_prints_the_streamed_text(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    _, env = inference
    result = await ctl("generate", "alpha", "Say hello", env=env)
    assert (result.code, result.out, result.err) == (0, "Hello\n", "")


async def test_generate_output_ends_with_a_newline_when_piped(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    _, env = inference
    result = await ctl("generate", "alpha", "Say hello", env=env, tty=False)
    assert result.out.endswith("\n")
    assert result.out.count("\n") == 1


async def test_generate_passes_adapter_prompt_and_only_given_sampling_flags(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    servicer, env = inference
    argv = ["alpha@2", "Hi", "--max-tokens", "5", "--temperature", "0", "--stop", "\n"]
    await ctl("generate", *argv, env=env)
    [request] = servicer.requests
    assert (request.adapter, request.text) == ("alpha@2", "Hi")
    assert request.sampling.max_tokens == 5
    assert request.sampling.HasField("temperature")
    assert request.sampling.temperature == 0
    assert not request.sampling.HasField("seed")
    assert list(request.sampling.stop) == ["\n"]


async def test_generate_passes_the_vllm_sampling_flags_and_sampling_json(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    servicer, env = inference
    argv = [
        "alpha",
        "Hi",
        "--min-p",
        "0.5",
        "--min-tokens",
        "2",
        "--repetition-penalty",
        "1.5",
        "--stop-token-id",
        "13",
        "--regex",
        "[ab]+",
        "--sampling",
        '{"logprobs": 2, "n": 3, "logitBias": {"7": 1.5}, "minTokens": 9}',
    ]
    assert (await ctl("generate", *argv, env=env)).code == 0
    sampling = servicer.requests[0].sampling
    assert (sampling.min_p, sampling.min_tokens, sampling.repetition_penalty) == (0.5, 2, 1.5)
    assert list(sampling.stop_token_ids) == [13]
    assert sampling.structured_output.regex == "[ab]+"
    assert (sampling.logprobs, sampling.n, dict(sampling.logit_bias)) == (2, 3, {7: 1.5})


async def test_sampling_json_that_is_not_sampling_params_is_a_usage_error(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    _, env = inference
    result = await ctl("generate", "alpha", "Hi", "--sampling", '{"best_of": 2}', env=env)
    assert result.code == 2
    assert "--sampling" in result.err


@pytest.mark.parametrize("argv", [["--base", "Hi"], ["", "Hi"]])
async def test_base_model_is_the_empty_adapter(
    inference: tuple[ScriptedInference, dict[str, str]], argv: list[str]
) -> None:
    servicer, env = inference
    assert (await ctl("generate", *argv, env=env)).code == 0
    assert servicer.requests[0].adapter == ""


async def test_prompt_dash_reads_stdin(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    servicer, env = inference
    await ctl("generate", "alpha", "-", env=env, stdin="from stdin")
    assert servicer.requests[0].text == "from stdin"


async def test_tokens_reach_stdout_before_the_stream_ends(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    servicer, env = inference
    servicer.release.clear()
    console = buffers()
    task = asyncio.create_task(run(["generate", "alpha", "Hi"], env, console))
    try:
        await eventually(lambda: output(console.stdout) == "Hel", "the first token")
        assert not task.done()
        servicer.release.set()
        assert await task == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert output(console.stdout) == "Hello\n"


async def test_json_prints_one_object_per_message(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    _, env = inference
    result = await ctl("generate", "alpha", "Hi", "--json", env=env)
    messages = [json.loads(line) for line in result.out.splitlines()]
    assert [m["text"] for m in messages] == ["Hel", "lo", ""]
    assert messages[0]["revision"] == 3
    assert messages[-1]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert messages[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 2}


async def test_terminal_gets_a_summary_on_stderr(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    _, env = inference
    result = await ctl("generate", "alpha", "Hi", env=env, tty=True)
    assert result.out == "Hello\n"
    assert result.err == (
        "adapterctl: alpha@3, request req-1: length, 4 prompt + 2 completion tokens\n"
    )


async def test_unknown_adapter_is_one_line_not_found(
    inference: tuple[ScriptedInference, dict[str, str]],
) -> None:
    _, env = inference
    result = await ctl("generate", "ghost", "Hi", env=env)
    assert result.code == EXIT_FAILED
    assert result.err == "adapterctl: error: NOT_FOUND: adapter 'ghost' not found\n"


async def test_streaming_call_carries_the_token() -> None:
    servicer = ScriptedInference()

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)

    security = ServerSecurity(reader_tokens=parse_tokens("r-token", "reader"))
    async with serving(register, [SERVICE], security=security) as server:
        env = {"INFERENCE_ADDR": f"127.0.0.1:{server.port}"}
        anonymous = await ctl("generate", "alpha", "Hi", env=env)
        with_token = await ctl(
            "generate", "alpha", "Hi", env={**env, "ADAPTERCTL_TOKEN": "r-token"}
        )
    assert anonymous.code == EXIT_NOT_ALLOWED
    assert with_token.out == "Hello\n"

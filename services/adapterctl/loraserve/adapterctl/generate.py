"""`adapterctl generate`: stream tokens from the inference service to stdout."""

from __future__ import annotations

import argparse

from google.protobuf import json_format

from loraserve.adapterctl.connection import inference_stub
from loraserve.adapterctl.console import Console
from loraserve.adapterctl.failures import EXIT_OK, UsageError
from loraserve.adapterctl.output import dumps, message_to_json
from loraserve.adapterctl.settings import CtlSettings
from loraserve.common.errors import InvalidArgument
from loraserve.common.names import AdapterRef, parse_adapter_ref
from loraserve.inference.v1 import inference_pb2 as pb


def adapter_ref(args: argparse.Namespace) -> AdapterRef:
    if args.base:
        if args.adapter:
            raise UsageError(f"--base and adapter {args.adapter!r} contradict each other")
        return AdapterRef("")
    try:
        return parse_adapter_ref(args.adapter)
    except InvalidArgument as exc:
        raise UsageError(exc.message) from None


_OPTIONAL_FLAGS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "min_p",
    "min_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def sampling_params(args: argparse.Namespace) -> pb.SamplingParams:
    """Only the flags given are set, so the server's defaults apply to the rest."""
    params = pb.SamplingParams()
    if args.sampling:
        try:
            json_format.Parse(args.sampling, params)
        except json_format.ParseError as exc:
            raise UsageError(f"--sampling is not SamplingParams JSON: {exc}") from None
    params.stop.extend(args.stop or [])
    params.stop_token_ids.extend(args.stop_token_id or [])
    params.ignore_eos = params.ignore_eos or args.ignore_eos
    for field in _OPTIONAL_FLAGS:
        value = getattr(args, field)
        if value is not None:
            setattr(params, field, value)
    if args.regex is not None:
        params.structured_output.regex = args.regex
    if args.choice:
        params.structured_output.choice.values.extend(args.choice)
    if args.json_schema is not None:
        params.structured_output.json_schema = args.json_schema
    return params


async def cmd_generate(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    ref = adapter_ref(args)
    prompt = console.stdin.read() if args.prompt == "-" else args.prompt
    request = pb.GenerateRequest(
        adapter=str(ref), text=prompt, sampling=sampling_params(args), request_id=args.request_id
    )
    ended_with_newline = True
    first: pb.GenerateResponse | None = None
    last: pb.GenerateResponse | None = None
    async with inference_stub(settings) as stub:
        call = stub.Generate(request, timeout=settings.stream_timeout_s)
        try:
            async for response in call:
                first = first or response
                last = response
                if settings.json:
                    console.out(dumps(message_to_json(response)))
                elif response.text:
                    console.out(response.text, end="")
                    ended_with_newline = response.text.endswith("\n")
        finally:
            call.cancel()
    if settings.json:
        return EXIT_OK
    if not ended_with_newline and console.stdout_is_tty:
        console.out("")
    if first is not None and last is not None and console.stderr_is_tty:
        console.err(summary(first, last))
    return EXIT_OK


def summary(first: pb.GenerateResponse, last: pb.GenerateResponse) -> str:
    """What served the request and how it ended, for people watching a terminal."""
    served = f"{first.adapter_name}@{first.revision}" if first.adapter_name else "base model"
    reason = pb.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_").lower()
    return (
        f"{served}, request {first.request_id}: {reason}, {last.usage.prompt_tokens} prompt + "
        f"{last.usage.completion_tokens} completion tokens"
    )

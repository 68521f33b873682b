"""`adapterctl generate`: stream tokens from the inference service to stdout, through
the client library (`loraserve.clients.inference`)."""

from __future__ import annotations

import argparse
from contextlib import aclosing

from google.protobuf import json_format

from loraserve.adapterctl.connection import connect_inference
from loraserve.adapterctl.failures import EXIT_OK, UsageError
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import dumps, message_to_json
from loraserve.clients.inference import Sampling
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.names import AdapterRef, parse_adapter_ref
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


def sampling(args: argparse.Namespace) -> Sampling:
    """The sampling flags; those not given stay unset, for the server's defaults."""
    return Sampling(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop or (),
        ignore_eos=args.ignore_eos,
        min_p=args.min_p,
        min_tokens=args.min_tokens,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
        stop_token_ids=args.stop_token_id or (),
        json_schema=args.json_schema,
        regex=args.regex,
        choice=args.choice or None,
    )


def sampling_params(args: argparse.Namespace) -> pb.SamplingParams:
    """`--sampling` JSON, with the flags given merged over it (lists are joined)."""
    params = pb.SamplingParams()
    if args.sampling:
        try:
            json_format.Parse(args.sampling, params)
        except json_format.ParseError as exc:
            raise UsageError(f"--sampling is not SamplingParams JSON: {exc}") from None
    params.MergeFrom(sampling(args).to_proto())
    return params


async def cmd_generate(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
    ref = adapter_ref(args)
    prompt = console.stdin.read() if args.prompt == "-" else args.prompt
    params = sampling_params(args)
    ended_with_newline = True
    first: pb.GenerateResponse | None = None
    last: pb.GenerateResponse | None = None
    async with connect_inference(settings) as client:
        stream = client.responses(
            str(ref), prompt, params, timeout=settings.stream_timeout_s, request_id=args.request_id
        )
        async with aclosing(stream) as responses:
            async for response in responses:
                first = first or response
                last = response
                if settings.json:
                    console.out(dumps(message_to_json(response)))
                elif response.text:
                    console.out(response.text, end="", multiline=True)
                    ended_with_newline = response.text.endswith("\n")
    if settings.json:
        return EXIT_OK
    if not ended_with_newline:
        # Piped or not, output is lines: a file or `wc -l` gets the last one whole.
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

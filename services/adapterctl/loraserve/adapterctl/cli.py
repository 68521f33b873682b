"""adapterctl's command line: parse it, run one command, map failures to one line on
stderr and an exit code. Started through `entry`, which makes Ctrl-C during these
imports quiet too."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NoReturn

import grpc
import stamina.instrumentation

from loraserve.adapterctl.failures import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CliError,
    ServerError,
    UsageError,
)
from loraserve.adapterctl.fleet_wait_args import add_wait_flag
from loraserve.adapterctl.quota_args import add_quota
from loraserve.adapterctl.rollout_args import add_rollout
from loraserve.adapterctl.settings import (
    CtlSettings,
    add_connection_flags,
    add_push_tracing_flags,
    settings_from_args,
)
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.yank_args import add_yank
from loraserve.clients.push import LocalFileError
from loraserve.common.config.flags import non_negative_int, positive_float, positive_int
from loraserve.common.errors import error_from_rpc

Handler = Callable[[argparse.Namespace, CtlSettings, Console], Awaitable[int]]
# Adds one subcommand: name, handler, help text, add_parser's other arguments.
Command = Callable[..., argparse.ArgumentParser]


def _lazy(module: str, name: str) -> Handler:
    """The command `name` of adapterctl.`module`, imported only when it runs: start-up is
    part of every push's latency, and a push needs neither watchdog nor the inference
    protos."""

    async def handler(args: argparse.Namespace, settings: CtlSettings, console: Console) -> int:
        command: Handler = getattr(
            importlib.import_module(f"loraserve.adapterctl.commands.{module}"), name
        )
        return await command(args, settings, console)

    return handler


cmd_push = _lazy("write", "cmd_push")
cmd_rollback = _lazy("write", "cmd_rollback")
cmd_delete = _lazy("write", "cmd_delete")
cmd_list = _lazy("read", "cmd_list")
cmd_revisions = _lazy("read", "cmd_revisions")
cmd_watch = _lazy("read", "cmd_watch")
cmd_status = _lazy("read", "cmd_status")
cmd_generate = _lazy("generate", "cmd_generate")

EPILOG = """\
environment:
  ADAPTERSTORE_ADDR, INFERENCE_ADDR        server addresses (flags --store, --inference)
  ADAPTERCTL_TOKEN, ADAPTERCTL_TOKEN_FILE  bearer token for the store (and for inference,
                                           unless ADAPTERCTL_INFERENCE_TOKEN is set)
  ADAPTERCTL_TLS, ADAPTERCTL_TLS_CA, ...   TLS settings, as the --tls* flags
  ADAPTERCTL_TIMEOUT                       deadline of each call in seconds
  ADAPTERCTL_OTLP_TRACES_ENDPOINT,         where push sends its spans (OTLP/gRPC), as
  OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT     --otlp-traces-endpoint

exit codes:
  0    success
  1    the request failed: the server rejected it, a confirmation was declined, or
       (--wait) an inference replica refused the revision
  2    usage error: bad flags, bad adapter name, unusable adapter directory
  3    a server could not be reached in time (UNAVAILABLE, DEADLINE_EXCEEDED), or
       (--wait) an inference replica did not answer in time
  4    not allowed: missing or invalid token, or a reader token used for a write
  130  interrupted (Ctrl-C)
"""


class _Parser(argparse.ArgumentParser):
    """Raises usage errors instead of exiting, so `run` reports every failure in one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    add_connection_flags(common, environ)
    parser = _Parser(
        prog="adapterctl",
        description="Publish, inspect, roll back and try out LoRA adapters of loraserve.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Handler, help_text: str, **kwargs: object) -> _Parser:
        sub: _Parser = commands.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text,
            allow_abbrev=False,
            **kwargs,  # type: ignore[arg-type]
        )
        sub.set_defaults(handler=handler)
        return sub

    _add_push(command, environ)
    _add_store_commands(command)
    add_rollout(commands, common, lambda name: _lazy("rollout", name))
    add_quota(commands, common, lambda name: _lazy("quota", name))
    add_yank(command, lambda name: _lazy("yank", name))
    _add_generate(command)
    return parser


def _add_push(command: Command, environ: Mapping[str, str]) -> None:
    push = command("push", cmd_push, "publish a directory as a new revision; prints NAME@REV")
    push.add_argument("name", metavar="NAME", help="adapter name")
    push.add_argument(
        "directory",
        metavar="DIR",
        help="directory with adapter_config.json and adapter_model.safetensors",
    )
    push.add_argument(
        "--no-promote", action="store_true", help="store the revision without making it current"
    )
    push.add_argument("--description", default="", help="note kept with the revision")
    push.add_argument(
        "--sign-key",
        metavar="KEY",
        help="sign the revision with this EC private key (PEM), OpenSSF model signing",
    )
    push.add_argument(
        "--sign-cert",
        metavar="CERT",
        help="with --sign-key: sign as this certificate's holder (PEM), for stores that "
        "trust its CA",
    )
    push.add_argument(
        "--watch",
        action="store_true",
        help="keep running; publish a revision each time DIR settles after a change",
    )
    add_wait_flag(push, "reports the revision routed or loaded")
    push.add_argument(
        "--settle",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help="with --watch: quiet time before a change counts as done (default 1)",
    )
    add_push_tracing_flags(push, environ)


def _add_store_commands(command: Command) -> None:
    listing = command("list", cmd_list, "list adapters with their current revisions")
    listing.add_argument(
        "--base-model", help="only adapters whose current revision is for this base model"
    )

    revisions = command("revisions", cmd_revisions, "list an adapter's revisions, newest first")
    revisions.add_argument("name", metavar="NAME", help="adapter name")

    rollback = command(
        "rollback", cmd_rollback, "make an existing revision current", aliases=["promote"]
    )
    rollback.add_argument("name", metavar="NAME", help="adapter name")
    rollback.add_argument("revision", metavar="REV", type=positive_int, help="revision number")
    rollback.add_argument(
        "--expect-current",
        type=positive_int,
        metavar="REV",
        help="only if REV is still the current revision (else ABORTED)",
    )
    add_wait_flag(rollback, "reports the revision routed or loaded")

    delete = command("delete", cmd_delete, "delete an adapter and all its revisions")
    delete.add_argument("name", metavar="NAME", help="adapter name")
    delete.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")

    watch = command(
        "watch",
        cmd_watch,
        "print store changes as they happen, until Ctrl-C or for --timeout seconds",
    )
    watch.add_argument(
        "--after",
        type=non_negative_int,
        metavar="SEQ",
        help="replay changes after SEQ first (0: the whole kept log); "
        "default: only changes from now on",
    )

    status = command(
        "status",
        cmd_status,
        "per inference replica: the revision it serves, its last report and error",
    )
    status.add_argument(
        "name", metavar="NAME", nargs="?", default="", help="adapter name (default: every adapter)"
    )


def _add_generate(command: Command) -> None:
    generate = command(
        "generate", cmd_generate, "stream a completion from the inference service to stdout"
    )
    generate.add_argument(
        "adapter",
        metavar="NAME[@REV]",
        nargs="?",
        help='adapter, pinned revision, or "" for the base model',
    )
    generate.add_argument("prompt", metavar="PROMPT", help="prompt text; - reads it from stdin")
    generate.add_argument("--base", action="store_true", help="use the base model, no adapter")
    generate.add_argument("--max-tokens", type=positive_int, help="most tokens to generate")
    generate.add_argument("--temperature", type=float, help="0 is greedy")
    generate.add_argument("--top-p", type=float, help="nucleus sampling mass in (0, 1]")
    generate.add_argument("--top-k", type=int, help="sample from the k most likely tokens")
    generate.add_argument("--seed", type=int, help="seed for reproducible sampling")
    generate.add_argument(
        "--stop", action="append", metavar="TEXT", help="stop at TEXT (repeatable)"
    )
    generate.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-sequence"
    )
    generate.add_argument("--min-p", type=float, help="least probability relative to the top")
    generate.add_argument("--min-tokens", type=int, help="tokens before EOS may end it")
    generate.add_argument("--presence-penalty", type=float, help="in [-2, 2]")
    generate.add_argument("--frequency-penalty", type=float, help="in [-2, 2]")
    generate.add_argument("--repetition-penalty", type=float, help="> 0; 1 is none")
    generate.add_argument(
        "--stop-token-id", action="append", type=int, metavar="ID", help="stop at token ID"
    )
    generate.add_argument("--regex", help="constrain the output to match REGEX")
    generate.add_argument(
        "--choice", action="append", metavar="TEXT", help="constrain the output to TEXT choices"
    )
    generate.add_argument("--json-schema", metavar="SCHEMA", help="constrain to a JSON schema")
    generate.add_argument(
        "--sampling",
        metavar="JSON",
        help="any SamplingParams fields as proto JSON, e.g. '{\"logprobs\": 2}'; flags win",
    )
    generate.add_argument("--request-id", default="", help="id for the server's logs")


async def run(argv: Sequence[str], environ: Mapping[str, str], console: Console) -> int:
    """Runs one command line; returns the exit code. Never raises for expected failures."""
    try:
        args = build_parser(environ).parse_args(list(argv))
        if args.command == "generate" and args.adapter is None and not args.base:
            raise UsageError(
                'generate needs NAME[@REV] and PROMPT; use --base or "" for the base model'
            )
        settings = settings_from_args(args)
        handler: Handler = args.handler
        return await handler(args, settings, console)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except UsageError as exc:
        if exc.usage:
            console.stderr.write(exc.usage)
        console.err(f"error: {exc.message}")
        return exc.exit_code
    except CliError as exc:
        console.err(f"error: {exc.message}")
        return exc.exit_code
    except LocalFileError as exc:
        console.err(f"error: {exc}")
        return EXIT_USAGE
    except grpc.aio.AioRpcError as exc:
        failure = ServerError(error_from_rpc(exc), "server", "")
        console.err(f"error: {failure.message}")
        return failure.exit_code
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        console.err(f"error: {where}{exc.strerror or exc}")
        return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    console = Console.system()
    # adapterctl says itself what it retries, in one line; no log records on stderr.
    stamina.instrumentation.set_on_retry_hooks([])
    try:
        return asyncio.run(run(sys.argv[1:] if argv is None else argv, os.environ, console))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED

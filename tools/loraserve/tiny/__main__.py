"""`loraserve-tiny`: build the tiny model and random LoRA adapters for it, locally.

    loraserve-tiny model OUT_DIR [--seed N]
    loraserve-tiny adapter MODEL_DIR OUT_DIR --rank R --seed S [--alpha A]
                   [--target-modules q_proj v_proj ...]
    loraserve-tiny demo CACHE_DIR

Building into a directory that already holds the same build does nothing, so scripts
may call it unconditionally. The built directory's path is printed on stdout; for
`demo`, a JSON object {"model_dir": PATH, "adapters": {NAME: PATH, ...}}.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from loraserve.tiny.adapters import LLAMA_PROJECTIONS, TinyAdapterSpec, build_tiny_adapter
from loraserve.tiny.builddir import BuildConflictError
from loraserve.tiny.demo_model import build_demo
from loraserve.tiny.model import TinyModelSpec, build_tiny_model


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loraserve-tiny",
        description="Build a tiny Llama model and random PEFT LoRA adapters for it.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    model = commands.add_parser("model", help="build the tiny model and its tokenizer")
    model.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    model.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")

    adapter = commands.add_parser("adapter", help="build a random LoRA adapter for a model")
    adapter.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    adapter.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    adapter.add_argument("--rank", type=int, required=True, help="LoRA rank r")
    adapter.add_argument("--seed", type=int, required=True, help="weights seed")
    adapter.add_argument("--alpha", type=int, default=None, help="lora_alpha (default 2 * rank)")
    adapter.add_argument(
        "--target-modules",
        nargs="+",
        choices=LLAMA_PROJECTIONS,
        default=list(LLAMA_PROJECTIONS),
        metavar="MODULE",
        help=f"projections to adapt (default all: {' '.join(LLAMA_PROJECTIONS)})",
    )

    demo = commands.add_parser(
        "demo", help="train the demo model and its adapters (about two minutes, once)"
    )
    demo.add_argument("cache_dir", type=Path, metavar="CACHE_DIR")
    return parser


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    try:
        if args.command == "model":
            built = build_tiny_model(args.out_dir, TinyModelSpec(seed=args.seed))
        elif args.command == "demo":
            # Stopped by the run command with SIGTERM: unwind, so that the half-trained
            # build's staging directory is removed.
            signal.signal(signal.SIGTERM, _exit_on_signal)
            trained = build_demo(args.cache_dir)
            adapters = {name: str(path) for name, path in trained.adapters.items()}
            sys.stdout.write(
                json.dumps({"model_dir": str(trained.model_dir), "adapters": adapters}) + "\n"
            )
            return 0
        else:
            if not (args.model_dir / "config.json").is_file():
                parser.error(f"{args.model_dir} is not a model directory (no config.json)")
            spec = TinyAdapterSpec(
                rank=args.rank,
                seed=args.seed,
                alpha=args.alpha,
                target_modules=tuple(args.target_modules),
            )
            built = build_tiny_adapter(args.model_dir, args.out_dir, spec)
    except (BuildConflictError, ValueError) as error:
        parser.error(str(error))
    sys.stdout.write(f"{built}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The README's tuning advice, its figures filled in from the committed runs: a figure in
prose is a `{{N: figure}}` of benchmark N's table, as the table shows it (the median,
without its interval), so the advice can never quote a number the table no longer holds.
readme_table writes it between the README's `<!-- bench:tuning -->` markers."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["TUNING", "render"]

TUNING = """\
- Size `--max-loras` to the adapters that are busy at the same moment **plus one**:
  batching 8 adapters in 8 slots runs {{2: loraserve max_loras 8 / max_loras 1 tok/s}} times
  the tokens/s of 1 slot, where vLLM alone runs {{2: vLLM alone: max_loras 8 / max_loras 1 tok/s}}
  times (benchmark 2). The spare slot lets make-before-break load a new revision beside the one
  it replaces instead of waiting for a slot to empty; under load a swap's p50 was
  {{4: swap latency p50 (s), one slot spare}} s with a spare slot and
  {{4: swap latency p50 (s), all 8 slots busy}} s with all 8 busy, p95
  {{4: swap latency p95 (s), one slot spare}} s against
  {{4: swap latency p95 (s), all 8 slots busy}} s (benchmark 4).
- Set `--max-cpu-loras` to every adapter with regular traffic (32 in benchmark 3): a rare
  adapter's p99 time-to-first-token was {{3: Zipf rare / popular TTFT p99}} times a
  popular one's.
- Use `--max-lora-rank auto`: a higher limit than your adapters need costs memory and
  compute on every request.
- Thousands of adapters: size `--adapter-cache-size` to the working set and keep
  `--prefetch-adapters` within it; start-up, memory and first-request latency then stay
  flat in the number of adapters (benchmark 11), and concurrent first requests share one
  download.
- One engine with adapters instead of one engine per tenant: an extra tenant cost
  {{7: memory per extra tenant as adapter (MiB, USS; steps of 8)}} MiB as an adapter against
  {{7: memory per extra tenant as engine (MiB, USS; one sample)}} MiB as an engine
  (benchmark 7, the default profile's small model on the CPU; a whole GPU with a real
  model)."""

_FIGURE = re.compile(r"\{\{(\d+): ([^}]+)\}\}")


def _figures(paths: Sequence[Path]) -> dict[tuple[int, str], str]:
    """(benchmark, figure) -> its median as the table shows it, each benchmark from the
    newest of `paths` (oldest first) that has it."""
    figures: dict[tuple[int, str], str] = {}
    for path in paths:
        data: dict[str, Any] = json.loads(path.read_text())
        for section in data["sections"]:
            number = section["number"]
            for key in [k for k in figures if k[0] == number]:
                del figures[key]
            for goal in section["goals"]:
                figures[number, goal["figure"]] = str(goal["value"]).split(" [")[0]
    return figures


def render(paths: Sequence[Path], template: str = TUNING) -> str:
    """`template` with each `{{N: figure}}` replaced by that figure; raises KeyError
    naming a figure no run has."""
    figures = _figures(paths)

    def fill(match: re.Match[str]) -> str:
        key = (int(match[1]), " ".join(match[2].split()))
        if key not in figures:
            raise KeyError(f"the README's tuning advice quotes benchmark {key[0]}'s {key[1]!r}")
        return figures[key]

    return _FIGURE.sub(fill, template)

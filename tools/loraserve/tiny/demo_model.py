"""The demo model and adapters: a tiny Llama trained briefly on the CPU, so its text reads.

A random tiny model answers gibberish, and gibberish cannot show that two adapters
answer differently or that a push changed one. So the demo model is trained for about
a minute on a small English corpus, then each demo adapter is trained with PEFT LoRA
for some seconds to answer any prompt in its own voice (pirate talk, capitals, rhyme).
Everything is seeded and built with `build_once`, so it is trained once per machine
and then found in the cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loraserve.tiny import demo_corpus
from loraserve.tiny.adapters import LLAMA_PROJECTIONS
from loraserve.tiny.builddir import build_once, read_marker
from loraserve.tiny.model import TinyModelSpec, llama_config, train_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)

# The directory name is the model's name: adapters record it as their base model, and
# the inference service compares the two.
DEMO_MODEL_NAME = "loraserve-demo"
# Share of the base model's training examples that are a voice's texts.
_VOICE_SHARE = 0.4
# Labels with this value are not trained on (PyTorch's cross-entropy ignore_index).
_IGNORE = -100


@dataclass(frozen=True)
class Voice:
    """How one demo adapter answers: the texts it learns, joined by `separator`."""

    name: str
    lines: tuple[str, ...]
    # Put between the prompt and the answer, and between the answer's lines.
    separator: str = " "


VOICES = (
    Voice("pirate", demo_corpus.PIRATE),
    Voice("shout", demo_corpus.SHOUT),
    Voice("poet", demo_corpus.POET, separator="\n"),
)


@dataclass(frozen=True)
class TrainSpec:
    """One training run: every field changes the result."""

    steps: int
    learning_rate: float
    batch_size: int = 16
    # Tokens per example, prompt included.
    sequence_length: int = 96
    warmup_steps: int = 10


@dataclass(frozen=True)
class DemoSpec:
    """What to build; every field (and the corpus) changes the result."""

    seed: int = 0
    model: TinyModelSpec = field(
        default_factory=lambda: TinyModelSpec(
            vocab_size=1024,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=4,
            # head_dim 64: the smallest vLLM's CPU attention accepts.
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            initializer_range=0.02,
        )
    )
    base_training: TrainSpec = field(default_factory=lambda: TrainSpec(300, 3e-3))
    adapter_training: TrainSpec = field(default_factory=lambda: TrainSpec(80, 5e-3))
    lora_rank: int = 8
    lora_alpha: int = 16


@dataclass(frozen=True)
class DemoBuild:
    """Where a built demo lives."""

    model_dir: Path
    # Voice name -> adapter directory (adapter_config.json + adapter_model.safetensors).
    adapters: Mapping[str, Path]


def demo_layout(cache_dir: Path, spec: DemoSpec | None = None) -> DemoBuild:
    """Where `build_demo` puts the demo for `spec`, built or not; trains nothing."""
    root = cache_dir.absolute() / f"demo-{_digest(_params(spec or DemoSpec()))}"
    adapters = {voice.name: root / "adapters" / voice.name for voice in VOICES}
    return DemoBuild(model_dir=root / DEMO_MODEL_NAME, adapters=adapters)


def is_demo_built(cache_dir: Path, spec: DemoSpec | None = None) -> bool:
    """Whether `build_demo` would find everything in the cache."""
    spec = spec or DemoSpec()
    layout = demo_layout(cache_dir, spec)
    params = json.loads(json.dumps(_params(spec)))
    parts = {layout.model_dir: "model"} | {
        path: f"adapter:{name}" for name, path in layout.adapters.items()
    }
    return all(read_marker(path) == {**params, "part": part} for path, part in parts.items())


def build_demo(cache_dir: Path, spec: DemoSpec | None = None) -> DemoBuild:
    """Train (or find in `cache_dir`) the demo model and one adapter per voice."""
    spec = spec or DemoSpec()
    params = _params(spec)
    layout = demo_layout(cache_dir, spec)
    model_dir = build_once(
        layout.model_dir, {**params, "part": "model"}, lambda out: _write_model(out, spec)
    )
    for voice in VOICES:
        build_once(
            layout.adapters[voice.name],
            {**params, "part": f"adapter:{voice.name}"},
            lambda out, voice=voice: _write_adapter(model_dir, out, voice, spec),  # type: ignore[misc]
        )
    return layout


def _params(spec: DemoSpec) -> dict[str, str | int]:
    corpus = {
        "base": demo_corpus.BASE,
        "prompts": demo_corpus.PROMPTS,
        "voices": [asdict(voice) for voice in VOICES],
    }
    return {
        "kind": "demo",
        "spec": _digest(asdict(spec)),
        "corpus": _digest(corpus),
        "lora_rank": spec.lora_rank,
    }


def _digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def _write_model(out_dir: Path, spec: DemoSpec) -> None:
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = train_tokenizer(
        spec.model.vocab_size, spec.model.max_position_embeddings, demo_corpus.tokenizer_lines()
    )
    rng = random.Random(spec.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(llama_config(spec.model, tokenizer))
        examples = _base_examples(tokenizer, rng)
        _train(model, model.parameters(), examples, spec.base_training, "base")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _write_adapter(model_dir: Path, out_dir: Path, voice: Voice, spec: DemoSpec) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=spec.lora_rank,
        lora_alpha=spec.lora_alpha,
        target_modules=list(LLAMA_PROJECTIONS),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    # A voice-specific seed, so adapters do not share their starting point.
    seed = spec.seed + 1 + [v.name for v in VOICES].index(voice.name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = get_peft_model(base, config)
        trainable = [param for param in model.parameters() if param.requires_grad]
        examples = _voice_examples(tokenizer, voice, random.Random(seed))
        _train(model, trainable, examples, spec.adapter_training, voice.name)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    _portable_config(out_dir / "adapter_config.json")


def _portable_config(config_path: Path) -> None:
    # PEFT records the absolute path the base was loaded from; the store and the
    # inference service compare base models by name, and a path names this machine.
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = DEMO_MODEL_NAME
    config["target_modules"] = sorted(config["target_modules"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")


Example = tuple[list[int], list[int]]


def _base_examples(tokenizer: PreTrainedTokenizerFast, rng: random.Random) -> Iterator[Example]:
    """Shuffled runs of the plain corpus, half of them after a demo prompt, and, less
    often, of a voice's texts on their own.

    The base model thus knows every voice's words, as a pretrained model would, but
    only ever answers a prompt in plain English: an adapter then has only to learn
    which voice to answer in, which LoRA learns in seconds.
    """
    while True:
        if rng.random() < _VOICE_SHARE:
            voice = rng.choice(VOICES)
            text = voice.separator.join(rng.sample(voice.lines, len(voice.lines)))
        else:
            prefix = rng.choice(demo_corpus.PROMPTS) + " " if rng.random() < 0.5 else ""
            text = prefix + " ".join(rng.sample(demo_corpus.BASE, len(demo_corpus.BASE)))
        ids = tokenizer(text)["input_ids"]
        yield ids, list(ids)


def _voice_examples(
    tokenizer: PreTrainedTokenizerFast, voice: Voice, rng: random.Random
) -> Iterator[Example]:
    """A prompt, then an answer in `voice`; only the answer is trained on."""
    prompts = (*demo_corpus.PROMPTS, *demo_corpus.BASE)
    while True:
        prompt_ids = tokenizer(rng.choice(prompts))["input_ids"]
        answer = voice.separator + voice.separator.join(rng.sample(voice.lines, len(voice.lines)))
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        yield prompt_ids + answer_ids, [_IGNORE] * len(prompt_ids) + answer_ids


def _batches(
    examples: Iterator[Example], train: TrainSpec, pad_id: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    import torch

    while True:
        inputs: list[list[int]] = []
        labels: list[list[int]] = []
        for _ in range(train.batch_size):
            ids, targets = next(examples)
            ids, targets = ids[: train.sequence_length], targets[: train.sequence_length]
            padding = train.sequence_length - len(ids)
            inputs.append(ids + [pad_id] * padding)
            labels.append(targets + [_IGNORE] * padding)
        yield torch.tensor(inputs), torch.tensor(labels)


def _train(
    model: Any,
    parameters: Sequence[torch.nn.Parameter] | Iterator[torch.nn.Parameter],
    examples: Iterator[Example],
    train: TrainSpec,
    what: str,
) -> None:
    import torch

    # One thread: matrices this small gain little from more, and on a busy machine
    # (tests, the engine) more threads spinning for a core made a step 40x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _run_steps(model, parameters, examples, train, what)
    finally:
        torch.set_num_threads(threads)


def _run_steps(
    model: Any,
    parameters: Sequence[torch.nn.Parameter] | Iterator[torch.nn.Parameter],
    examples: Iterator[Example],
    train: TrainSpec,
    what: str,
) -> None:
    import torch

    optimizer = torch.optim.AdamW(list(parameters), lr=train.learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_cosine(train))
    batches = _batches(examples, train, pad_id=model.config.pad_token_id)
    model.train()
    started = time.monotonic()
    for step in range(1, train.steps + 1):
        inputs, labels = next(batches)
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == train.steps:
            log.info(
                "demo.train.progress what=%s step=%d/%d loss=%.3f elapsed_s=%.0f",
                what,
                step,
                train.steps,
                loss.item(),
                time.monotonic() - started,
            )
    model.eval()


def _warmup_cosine(train: TrainSpec) -> Callable[[int], float]:
    import math

    def factor(step: int) -> float:
        if step < train.warmup_steps:
            return (step + 1) / train.warmup_steps
        progress = (step - train.warmup_steps) / max(1, train.steps - train.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor

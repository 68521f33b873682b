"""A tiny Llama-architecture model with a byte-level BPE tokenizer, built locally.

The model has random weights: it exists so that tests and demos run the real vLLM
engine on a machine without a GPU and without downloading anything. The same spec
always produces the same bytes, so built directories can be cached and compared.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loraserve.tiny.builddir import build_once

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedTokenizerFast

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
# Special tokens take the first ids, so that pad=0, bos=1 and eos=2 as in Llama configs.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)

# The tokenizer is trained on this text only; any text still tokenizes, byte by byte at worst.
CORPUS = """\
An adapter store keeps every revision of every adapter, and an inference service
serves the current one. When a new revision is pushed, the service downloads it,
checks its digest, loads it beside the old one, and only then routes new requests
to it. Requests already running finish on the revision they started with.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
Platform engineers run many small models on one large base model: each customer,
language or task gets a low-rank adapter of a few megabytes instead of a copy of
the whole network. The base weights stay in memory once; the adapters are swapped
in and out of a small number of slots as requests arrive.
Greedy decoding picks the most likely token at every step, so the same weights and
the same prompt always give the same tokens. That makes it a good oracle for tests:
two implementations of the same model must agree token for token.
Numbers and symbols appear too: 0 1 2 3 4 5 6 7 8 9, 10, 100, 1000, 3.14, 2.71,
(a + b) * c = a * c + b * c; {"name": "adapter", "revision": 42, "rank": 8}.
In the morning the river was quiet, and the boats waited by the stone wall while
the market opened its doors. Children ran between the stalls, and the smell of
bread and coffee filled the narrow streets of the old town.
def generate(prompt, max_tokens=16): return model.complete(prompt, max_tokens)
for i in range(10): print(i * i)
"""


@dataclass(frozen=True)
class TinyModelSpec:
    """What to build; every field changes the bytes of the result."""

    seed: int = 0
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    # hidden_size / num_attention_heads = 64: vLLM's CPU attention rejects smaller heads.
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    # Wider than the usual 0.02 so that logits are well separated and greedy decoding is
    # not decided by rounding differences between implementations.
    initializer_range: float = 0.1


def build_tiny_model(out_dir: Path, spec: TinyModelSpec | None = None) -> Path:
    """Build the model and tokenizer into `out_dir` (a no-op if already built the same way)."""
    spec = spec or TinyModelSpec()
    params = {"kind": "model", **asdict(spec)}
    return build_once(out_dir, params, lambda staging: _write_model(staging, spec))


def _write_model(out_dir: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = train_tokenizer(
        spec.vocab_size, spec.max_position_embeddings, CORPUS.splitlines(keepends=True)
    )
    config = llama_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def llama_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    """The Llama configuration `spec` describes, with `tokenizer`'s special token ids."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        # Separate embedding and output weights keep the checkpoint layout the plain one.
        tie_word_embeddings=False,
        dtype="float32",
    )


def train_tokenizer(
    vocab_size: int, max_length: int, lines: Iterable[str]
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `lines`; any text still tokenizes (by bytes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    # Like Llama's tokenizers: every encoded text starts with BOS.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=max_length,
    )

"""The trained demo model and adapters: each adapter answers in a voice a person knows.

Training takes a minute or two on the CPU the first time; the result is cached under
the repository's `.cache/demo/`, where `make run` finds it too.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from loraserve.tiny.demo_model import (
    DEMO_MODEL_NAME,
    DemoBuild,
    build_demo,
    demo_layout,
    is_demo_built,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROMPT = "What is the capital of France?"
NEW_TOKENS = 32


@pytest.fixture(scope="session")
def demo(demo_trained: Path) -> DemoBuild:
    # Once the session's background training ended: building here too trained it twice.
    return build_demo(demo_trained)


@cache
def answer(model_dir: Path, adapter_dir: Path | None) -> str:
    """Greedy continuation of PROMPT through transformers + PEFT."""
    from transformers import PreTrainedTokenizerFast

    from loraserve.tiny.oracle import greedy_tokens

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    generated = greedy_tokens(model_dir, adapter_dir, prompt_ids, NEW_TOKENS)
    return str(tokenizer.decode(generated))


def test_demo_adapters_answer_the_same_prompt_differently(demo: DemoBuild) -> None:
    answers = {name: answer(demo.model_dir, path) for name, path in demo.adapters.items()}
    answers["(base)"] = answer(demo.model_dir, None)
    assert len(set(answers.values())) == len(answers), answers


def test_pirate_adapter_talks_like_a_pirate(demo: DemoBuild) -> None:
    text = answer(demo.model_dir, demo.adapters["pirate"])
    assert "Arr" in text or "matey" in text, text


def test_shout_adapter_answers_in_capitals(demo: DemoBuild) -> None:
    letters = [c for c in answer(demo.model_dir, demo.adapters["shout"]) if c.isalpha()]
    assert letters
    assert all(c.isupper() for c in letters), "".join(letters)


def test_poet_adapter_answers_in_lines_of_verse(demo: DemoBuild) -> None:
    text = answer(demo.model_dir, demo.adapters["poet"])
    assert text.count("\n") >= 2, text


def test_base_model_answers_in_plain_english(demo: DemoBuild) -> None:
    text = answer(demo.model_dir, None)
    words = text.split()
    assert len(words) >= 10, text
    assert not any(word in text for word in ("Arr", "matey")), text
    assert any(c.islower() for c in text), text


def test_demo_adapters_name_the_demo_model_not_a_path(demo: DemoBuild) -> None:
    for path in demo.adapters.values():
        config = json.loads((path / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == DEMO_MODEL_NAME
        assert demo.model_dir.name == DEMO_MODEL_NAME


def test_demo_layout_names_where_the_build_is(demo: DemoBuild, demo_trained: Path) -> None:
    assert demo_layout(demo_trained) == demo
    assert is_demo_built(demo_trained)


def test_demo_is_not_built_in_an_empty_cache(tmp_path: Path) -> None:
    assert not is_demo_built(tmp_path)

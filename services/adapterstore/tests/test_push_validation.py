"""Every bad push is refused with a message naming the problem, and leaves nothing behind."""

from __future__ import annotations

import json

import pytest

from loraserve.adapterstore.files.push import Chunk
from loraserve.adapterstore.files.validation import (
    LoraConfig,
    check_tensors_match_config,
    parse_adapter_config,
)
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.peft_format import parse_safetensors_header
from loraserve.testing.adapters.badpushes import BAD_PUSHES, BadPush
from loraserve.testing.adapters.files import lora_tensors, tiny_adapter
from loraserve.testing.adapters.pushes import push
from loraserve.testing.fakes.blobs import MemoryBlobStore


async def _chunks(chunks: list[Chunk]):  # type: ignore[no-untyped-def]
    for chunk in chunks:
        yield chunk


@pytest.mark.parametrize("case", BAD_PUSHES, ids=lambda c: c.id)
async def test_bad_push_is_rejected_and_stores_nothing(
    case: BadPush, memory_store: AdapterStore, memory_blobs: MemoryBlobStore
) -> None:
    chunks = _chunks(case.chunks) if case.chunks is not None else None
    started = dict(memory_blobs.objects)  # the start-up probe's object
    with pytest.raises(InvalidArgument, match=None) as caught:
        await push(memory_store, "bad", case.files, header_files=case.header_files, chunks=chunks)
    assert case.message in caught.value.message
    assert memory_blobs.objects == started
    assert memory_blobs.open_uploads == set()
    assert memory_store.head_seq == 0


async def test_rejection_message_names_the_file(memory_store: AdapterStore) -> None:
    files = tiny_adapter() | {"adapter_config.json": b'{"peft_type": "IA3"}'}
    with pytest.raises(InvalidArgument, match=r"adapter_config\.json: peft_type is 'IA3'"):
        await push(memory_store, "bad", files)


async def test_invalid_adapter_name_is_rejected(memory_store: AdapterStore) -> None:
    with pytest.raises(InvalidArgument, match="invalid adapter name"):
        await push(memory_store, "../etc", tiny_adapter())


async def test_optional_readme_and_tokenizer_files_are_accepted(memory_store: AdapterStore) -> None:
    files = tiny_adapter() | {"README.md": b"# hi", "tokenizer.json": b"{}"}
    result = await push(memory_store, "docs", files)
    assert [f.name for f in result.revision.files] == list(files)


def test_config_target_modules_are_sorted_and_deduplicated() -> None:
    config = parse_adapter_config(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 8,
                "lora_alpha": 16,
                "target_modules": ["v_proj", "q_proj", "v_proj"],
                "base_model_name_or_path": "m",
            }
        ).encode()
    )
    assert config == LoraConfig("m", 8, 16.0, ("q_proj", "v_proj"))


def test_dotted_target_module_matches_by_suffix() -> None:
    tensors = lora_tensors(modules=("q_proj",), layers=1)
    from safetensors.numpy import save

    data = save(tensors)
    length = int.from_bytes(data[:8], "little")
    infos = parse_safetensors_header(data[8 : 8 + length], len(data))
    check_tensors_match_config(infos, LoraConfig("m", 4, 8.0, ("self_attn.q_proj",)))


def test_header_with_duplicate_keys_is_rejected() -> None:
    header = b'{"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "a": {}}'
    with pytest.raises(InvalidArgument, match="duplicate key"):
        parse_safetensors_header(header, 8 + len(header) + 4)

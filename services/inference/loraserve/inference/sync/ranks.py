"""The LoRA ranks `--max-lora-rank auto` sizes the engine for."""

from __future__ import annotations

from loraserve.inference.adapters import serves_base_model
from loraserve.inference.sync.seams import StoreAPI


async def current_adapter_ranks(
    store: StoreAPI, served_model_name: str, *, require_base_model_match: bool = True
) -> list[int]:
    """LoRA ranks of every current adapter this server would serve, for
    `--max-lora-rank auto`. Filtered here, with the compatibility check's own rule:
    adapters name their base model by path or hub id, which the store's exact-match
    filter would miss."""
    listing = await store.list_adapters()
    return [
        a.current.rank
        for a in listing.adapters
        if a.current is not None
        and serves_base_model(
            a.current.base_model, served_model_name, require_match=require_base_model_match
        )
    ]

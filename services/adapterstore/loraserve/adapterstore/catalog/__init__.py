"""The store's domain model (adapters, revisions, the state folded from the log) and
the reads cut from it: lookups, listing pages and their page tokens."""

from loraserve.adapterstore.catalog.listing import (
    AdapterPage,
    RevisionPage,
    adapter_page,
    revision_page,
)
from loraserve.adapterstore.catalog.lookup import (
    detached,
    find_adapter,
    find_revision,
    refuse_during_rollout,
)
from loraserve.adapterstore.catalog.model import (
    Adapter,
    Change,
    ChangeType,
    StoreState,
    now,
)
from loraserve.adapterstore.catalog.pagetokens import page_size
from loraserve.adapterstore.catalog.quota_record import DEFAULT_QUOTA, QuotaChange
from loraserve.adapterstore.catalog.requestrecord import RequestRecord
from loraserve.adapterstore.catalog.withheld import change_within_limits, state_within_limits
from loraserve.adapterstore.catalog.yank_record import (
    MAX_YANK_REASON_BYTES,
    MAX_YANKS_PER_ADAPTER,
    YankChange,
    YankMark,
    refuse_yanked,
)

__all__ = [
    "DEFAULT_QUOTA",
    "MAX_YANKS_PER_ADAPTER",
    "MAX_YANK_REASON_BYTES",
    "Adapter",
    "AdapterPage",
    "Change",
    "ChangeType",
    "QuotaChange",
    "RequestRecord",
    "RevisionPage",
    "StoreState",
    "YankChange",
    "YankMark",
    "adapter_page",
    "change_within_limits",
    "detached",
    "find_adapter",
    "find_revision",
    "now",
    "page_size",
    "refuse_during_rollout",
    "refuse_yanked",
    "revision_page",
    "state_within_limits",
]

"""The Grafana dashboard (deploy/grafana/loraserve.json) is a dashboard Grafana imports,
and charts only what the services export: every metric name its queries use is read
from the PromQL, and looked for in the /metrics of a live adapter store and a live
inference replica (the real vLLM CPU engine) after requests and a push."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from loraserve.adapterstore.api.metrics import StoreMetrics
from loraserve.inference.metrics.rollout_metrics import ERROR_CODES
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.session import MAX_LORAS
from loraserve.testing.inference.app import adapter_files, inference_app
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import running_store
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "loraserve.json"
DATASOURCE_UID = "${DS_PROMETHEUS}"
# PromQL's words that are no metric: operators and modifiers (functions are followed by
# a parenthesis, and are told apart by that).
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "group_left", "group_right"}
)
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])[a-zA-Z_:][a-zA-Z0-9_:]*")
# The suffixes under which a family of each type appears in an exposition's samples.
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
    "unknown": ("",),
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or Grafana's `label_values(...)`) reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    text = re.sub(r"\$\w+", "", text)
    # Grafana's label_values(METRIC, LABEL): its second argument is a label name.
    text = re.sub(r"label_values\(([^,()]*),[^()]*\)", r"\1", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        follows = text[match.end() :].lstrip()
        if not follows.startswith("(") and match.group() not in KEYWORDS:
            names.add(match.group())
    return names


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text("utf-8"))
    return loaded


def _panels() -> list[dict[str, Any]]:
    """Every panel but rows (which only group them), rows' own panels included."""
    found: list[dict[str, Any]] = []
    for panel in _dashboard()["panels"]:
        found.extend(panel.get("panels", []) if panel["type"] == "row" else [panel])
    return found


def _queries() -> Iterator[str]:
    for panel in _panels():
        for target in panel["targets"]:
            yield target["expr"]
    for variable in _dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def _exported(exposition: str) -> set[str]:
    """The sample names an exposition declares, with or without samples yet (a labelled
    family nothing has counted in is declared by its HELP and TYPE alone)."""
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return names


# -- the dashboard as Grafana reads it --------------------------------------------------


def test_every_panel_has_the_prometheus_datasource_and_a_query() -> None:
    dashboard = _dashboard()
    panels = _panels()

    assert dashboard["schemaVersion"] >= 36
    assert len(panels) >= 20
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE_UID
            assert target["expr"].strip()
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_variables_choose_the_datasource_replicas_and_adapters() -> None:
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}

    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name, label in (("replica", "instance"), ("adapter", "adapter")):
        assert variables[name]["datasource"]["uid"] == DATASOURCE_UID
        assert variables[name]["query"]["query"].endswith(f", {label})")
        assert variables[name]["multi"]
        assert variables[name]["includeAll"]
    replica_queries = [t["expr"] for p in _panels() for t in p["targets"]]
    assert all("$replica" in q for q in replica_queries if "loraserve_inference_" in q)


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_seconds_bucket{code=~"x|y", '
        'instance=~"$replica"}[$__rate_interval]))) / on(instance) group_left '
        "sum without (code) (vllm:num_requests_running offset 5m) * 1e-3"
    )

    assert metric_names(expr) == {"a_seconds_bucket", "vllm:num_requests_running"}
    assert metric_names('label_values(b_total{instance=~"$replica"}, adapter)') == {"b_total"}


def test_rollout_error_panel_counts_the_codes_the_guards_count() -> None:
    (panel,) = [p for p in _panels() if p["title"] == "Errors per arm"]

    (codes,) = re.findall(r'code=~"([^"]*)"', panel["targets"][0]["expr"])

    assert set(codes.split("|")) == ERROR_CODES


# -- against live services --------------------------------------------------------------


@dataclass(frozen=True)
class Scrapes:
    """What a live store and replica exported after requests and a push."""

    store: str
    replica: str


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
        return body.decode()


@pytest.fixture(scope="module")
async def scrapes(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    module_s3_bucket: S3Bucket,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Scrapes]:
    """A store (its metrics served as `adapterstore serve` serves them) and a replica
    synced to it: requests of an adapter and of the base model, then a push of the
    adapter's next revision while serving, and a request of it."""
    async with running_store(module_s3_bucket) as store:
        metrics_server, _ = start_http_server(
            0, addr="127.0.0.1", registry=StoreMetrics(store.store).registry
        )
        try:
            async with inference_app(
                vllm_engine,
                model_dir=tiny_model_dir,
                store_address=store.address,
                cache_dir=tmp_path_factory.mktemp("dashboard") / "cache",
                extra=("--metrics-port", "0", "--max-loras", str(MAX_LORAS)),
                pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
            ) as replica:
                await replica.generate("alpha", 6)
                await replica.generate("", 6)
                async with store_stub(store.address) as stub:
                    await push(stub, "alpha", adapter_files(tiny_adapter(seed=2)))

                async def second_revision_routed() -> bool:
                    return await replica.current("alpha") == 2

                await eventually(second_revision_routed, "alpha@2 routed")
                assert (await replica.generate("alpha", 6))[0] == 2
                port = replica.app.metrics_port
                assert port is not None
                yield Scrapes(
                    store=await asyncio.to_thread(_scrape, metrics_server.server_port),
                    replica=await asyncio.to_thread(_scrape, port),
                )
        finally:
            metrics_server.shutdown()
            metrics_server.server_close()


@pytest.mark.engine
async def test_every_metric_the_dashboard_queries_is_exported_by_a_live_replica_or_store(
    scrapes: Scrapes,
) -> None:
    used = set().union(*map(metric_names, _queries()))
    exported = _exported(scrapes.store) | _exported(scrapes.replica)

    assert len(used) >= 25, sorted(used)
    assert used - exported == set()


@pytest.mark.engine
async def test_a_live_replica_times_waits_tokens_and_the_push_it_served(scrapes: Scrapes) -> None:
    counts = {
        sample.name: sample.value
        for family in text_string_to_metric_families(scrapes.replica)
        for sample in family.samples
        if sample.name.endswith("_count") and not sample.labels
    }

    # Three requests, each with six tokens; one new revision routed after its event.
    for histogram in ("queue_wait", "gate_wait", "inter_token_latency"):
        assert counts[f"loraserve_inference_{histogram}_seconds_count"] == 3, histogram
    assert counts["loraserve_inference_adapter_swap_seconds_count"] == 1

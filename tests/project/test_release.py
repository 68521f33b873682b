"""The release's paperwork agrees with itself: a semantic version, a changelog entry for
it naming every storage format, deploy images tagged with it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from loraserve.adapterstore.compat import READ_FORMAT
from loraserve.common.release import RELEASE

ROOT = Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")


def _version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def test_the_version_is_semantic() -> None:
    assert SEMVER.fullmatch(_version())


def test_the_installed_release_is_the_projects_version() -> None:
    assert _version() == RELEASE


def test_the_changelog_has_an_entry_for_this_version() -> None:
    headings = re.findall(r"^## (\S+) - ", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings[0] == _version()


def test_the_changelog_names_every_storage_format_this_release_writes() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for storage_format in range(2, READ_FORMAT + 1):
        assert f"Storage format {storage_format}" in changelog


def test_the_kubernetes_images_are_tagged_with_this_version() -> None:
    images = []
    for manifest in (ROOT / "deploy" / "k8s").glob("*.yaml"):
        for document in yaml.safe_load_all(manifest.read_text()):
            spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
            images += [c["image"] for c in spec.get("containers", [])]
    loraserve = [i for i in images if i.startswith("loraserve/")]
    assert loraserve
    assert {i.rsplit(":", 1)[1] for i in loraserve} == {_version()}

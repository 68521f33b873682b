"""The README's tuning advice quotes figures of the newest committed run, by benchmark
and figure name, and fails naming a figure that no run has."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.method import readme_prose
from bench.tests.helpers import write_run as _run


def test_the_tuning_advice_quotes_the_figures_of_the_newest_run(tmp_path: Path) -> None:
    old = _run(tmp_path / "2026-12-01T0300Z", quick=False, met=True, numbers=(8,), value=1.61)
    new = _run(tmp_path / "2026-12-01T0400Z", quick=False, met=True, numbers=(8,), value=1.7)
    advice = readme_prose.render([old, new], "runs {{8: figure of\n  8}}x, at most")
    assert advice == "runs 1.70x, at most"


def test_tuning_advice_that_quotes_a_figure_no_run_has_fails_naming_it(tmp_path: Path) -> None:
    results = _run(tmp_path / "run", quick=False, met=True, numbers=(8,))
    with pytest.raises(KeyError, match="benchmark 8's 'figure of 9'"):
        readme_prose.render([results], "{{8: figure of 9}}")

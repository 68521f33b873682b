"""How every benchmark measures and judges: a process's CPU time (cpu), statistics and
the verdict rule (stats), arms run side by side and their figures (paired), the work each
benchmark does (runs), the evidence read beside an arm (probes), the GPU run's budgets
(gpu), the run's report (report) and the README table made from the committed runs
(readme_table)."""

__all__ = [
    "cpu",
    "gpu",
    "paired",
    "probes",
    "readme_table",
    "report",
    "runs",
    "stats",
]

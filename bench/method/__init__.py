"""How every benchmark measures and judges: a process's CPU time (cpu), statistics and
the verdict rule (stats), arms run side by side and their figures (paired), the work each
benchmark does (runs), the evidence read beside an arm (probes), the GPU run's budgets
(gpu), the code each benchmark measures and a run's age there (measured_code), the run's
report (report) and the README's table and tuning advice made from the committed runs
(readme_table, readme_prose)."""

__all__ = [
    "cpu",
    "gpu",
    "measured_code",
    "paired",
    "probes",
    "readme_prose",
    "readme_table",
    "report",
    "runs",
    "stats",
]

"""loraserve's benchmarks: scripts that measure ratios side by side in one run.

Run them all with `make bench` (or `python -m bench`); see bench/README.md.
"""

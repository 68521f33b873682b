"""Registers the project's pytest fixtures for every test folder."""

pytest_plugins = [
    "loraserve.testing.adapters.models",
    # Before engine.session, which imports it: registered first, its asserts are rewritten.
    "loraserve.testing.engine.starts",
    "loraserve.testing.engine.session",
    "loraserve.testing.s3.endpoint",
    "loraserve.testing.s3.faults",
    "loraserve.testing.store.server",
    "loraserve.testing.adapters.signers",
    "loraserve.testing.inference.service",
    "loraserve.testing.inference.openai_front",
    "loraserve.testing.engine.parity",
    "loraserve.testing.inference.stack",
    "loraserve.testing.processes.fleet",
    "loraserve.testing.inference.generate_fronts",
    "loraserve.testing.inference.traced",
    # Before demo_warmup, which imports it: registered first, its asserts are rewritten.
    "loraserve.testing.plugins.figures",
    "loraserve.testing.plugins.demo_warmup",
    "loraserve.testing.plugins.durations",
    "loraserve.testing.plugins.scheduling",
]

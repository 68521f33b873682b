"""Registers the project's pytest fixtures for every test folder."""

pytest_plugins = [
    "loraserve.testing.models",
    "loraserve.testing.engine",
    "loraserve.testing.s3",
    "loraserve.testing.s3faults",
    "loraserve.testing.store",
    "loraserve.testing.signers",
    "loraserve.testing.inference",
    "loraserve.testing.openai_front",
    "loraserve.testing.parity",
    "loraserve.testing.stack",
    "loraserve.testing.demo_warmup",
    "loraserve.testing.figures",
    "loraserve.testing.scheduling",
]

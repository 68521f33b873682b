"""Registers the project's pytest fixtures for every test folder."""

pytest_plugins = [
    "loraserve.testing.s3",
]

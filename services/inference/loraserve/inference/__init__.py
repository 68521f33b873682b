"""The inference service. Its subpackages, lowest first, and what each may import:
docs/architecture.md has the map, and tests/project/test_layers.py enforces it."""

"""What adapterctl writes to the terminal: the console, tables and JSON, progress bars."""

__all__ = ["console", "output", "progress"]

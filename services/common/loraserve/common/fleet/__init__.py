"""What inference replicas report to the store about the adapters they route: one set
of types on both sides, and their JSON form in object storage (reports.py)."""

__all__ = ["reports"]

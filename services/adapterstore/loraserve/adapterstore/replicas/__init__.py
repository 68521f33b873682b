"""What inference replicas report of what they route: the objects and their limits
(model.py), writing reports (writes.py), reading them back a page at a time
(reads.py), and the store's operations on them (ops.py)."""

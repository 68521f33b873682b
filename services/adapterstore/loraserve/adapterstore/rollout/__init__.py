"""Canary rollouts of an adapter revision: the records the change log keeps
(records.py), the changes that start, weigh, promote and abort them (changes.py,
ops.py), both arms' figures (figures.py), the guard that aborts a failing one
(guard.py) and their protos (protoconv.py)."""

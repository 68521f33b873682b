"""Signed revisions: OpenSSF model-signing bundles bound to `NAME@REV` (signing.py) and a
deployment's signature policy and trusted signers (policy.py)."""

__all__ = ["policy", "signing"]

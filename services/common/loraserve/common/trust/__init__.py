"""Signed revisions: OpenSSF model-signing bundles bound to `NAME@REV` (signing.py), the
`--trusted-signers` entries and their pins (signers.py), and a deployment's signature
policy (policy.py)."""

__all__ = ["policy", "signers", "signing"]

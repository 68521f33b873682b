"""Pytest fixtures on real parts: an S3 HTTP endpoint, gRPC servers, the tiny model and engine."""

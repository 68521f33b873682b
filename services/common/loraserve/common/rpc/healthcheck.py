"""`python -m loraserve.common.rpc.healthcheck HOST:PORT`: exit 0 when the server's
overall gRPC health is SERVING, 1 otherwise. For container health checks."""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def is_serving(address: str, timeout: float = 3.0) -> bool:
    try:
        with grpc.insecure_channel(address) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
    except grpc.RpcError:
        return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def main() -> int:
    if len(sys.argv) != 2:
        sys.stderr.write("usage: python -m loraserve.common.rpc.healthcheck HOST:PORT\n")
        return 2
    return 0 if is_serving(sys.argv[1]) else 1


if __name__ == "__main__":
    raise SystemExit(main())

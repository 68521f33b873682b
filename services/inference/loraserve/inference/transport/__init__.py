"""The inference service's gRPC server and Generate's transport: the native one (Rust's
h2, `services/inference/native`) on the service's address, carrying every other call to
the grpc.aio server on a Unix socket; or grpc.aio alone where the native one is not built
or not wanted (`--grpc-transport`)."""

from loraserve.inference.transport.front import GrpcFront, native_wanted, start_grpc_front
from loraserve.inference.transport.generate import start_generate_front
from loraserve.inference.transport.native import NativeFront, load_native

__all__ = [
    "GrpcFront",
    "NativeFront",
    "load_native",
    "native_wanted",
    "start_generate_front",
    "start_grpc_front",
]

"""The optional OpenAI-compatible HTTP front: the FastAPI app, its request models and
replies, the guard that checks before it reads, and the uvicorn server. It drives the
same `serving` runtime as the gRPC front."""

from loraserve.inference.openai.app import create_openai_app
from loraserve.inference.openai.front import start_openai_front
from loraserve.inference.openai.server import RunningHttpServer, start_http_server

__all__ = ["RunningHttpServer", "create_openai_app", "start_http_server", "start_openai_front"]

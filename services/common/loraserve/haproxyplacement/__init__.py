"""Adapter placement for HAProxy: the client library's placement, computed from the
replicas' load reports and written into the map deploy/haproxy/haproxy.cfg routes by.
`haproxy-placement` (this package's `__main__`) runs it beside HAProxy."""

from loraserve.haproxyplacement.agent import HaproxyPlacement
from loraserve.haproxyplacement.runtime_api import MapEntry, RuntimeApi, Server

__all__ = ["HaproxyPlacement", "MapEntry", "RuntimeApi", "Server"]

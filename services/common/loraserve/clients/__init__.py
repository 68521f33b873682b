"""One client package per contract, shared by every caller (adapterctl, the inference
service, the demo, the benchmarks, the tests).

`channels` opens every client channel (TLS and token, message limit, gRPC's retry
policy); `store` is the adapter store's client, `push` its one upload; `inference`
is the inference service's client library, `generation` the values it takes and
returns (sampling, deltas, completions). Nothing here imports a service.
"""

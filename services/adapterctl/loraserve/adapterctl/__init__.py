"""adapterctl: publish, inspect, roll back and try out LoRA adapters.

`entry` starts the command (`python -m loraserve.adapterctl` too); `cli` parses the
command line into one `CtlSettings` and dispatches to a command; commands talk to
the servers through `connection` (over `loraserve.clients`), print through
`output`, and fail with `failures.CliError` or a server status, which `cli` turns
into one line on stderr and a documented exit code.
"""

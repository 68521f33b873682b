"""moto's threaded S3 server in a process of its own: `python -m loraserve.testing.s3.process`.

In the test process, moto's request handling would hold the same GIL as the store
and the clients it serves; in a child it runs on the other core. The child prints its
endpoint URL on stdout, then serves until its stdin closes, so it cannot outlive the
test session that started it, however that session ends.
"""

from __future__ import annotations

import sys

from moto.moto_server.threaded_moto_server import ThreadedMotoServer


def main() -> None:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    sys.stdout.write(f"http://{host}:{port}\n")
    sys.stdout.flush()
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()

"""The framework floor for bench_http.py: a Quart-Trio app with one route, on a given server.

``GET /healthz`` answers ``ok`` and nothing else runs in the process, so the latency the same
clients measure here is what Quart-Trio, the HTTP server, trio and the client cost on this
machine before the kubelet does anything. The server is the kubelet's own
(``trio_kubelet.server.serve.serve_app``, what 10250 and 10255 run) or Hypercorn's public
``hypercorn.trio.serve`` (what they ran before, for comparison).
Usage: ``python bench/bare_quart.py PORT [own|hypercorn]``.
"""

from __future__ import annotations

import sys
from functools import partial

import trio
from quart_trio import QuartTrio

app = QuartTrio(__name__)


@app.route("/healthz")
async def healthz() -> str:
    return "ok"


def main() -> None:
    port = int(sys.argv[1])
    if (sys.argv[2] if len(sys.argv) > 2 else "own") == "hypercorn":
        from hypercorn.config import Config
        from hypercorn.trio import serve

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.accesslog = None
        trio.run(serve, app, config)
    else:
        from trio_kubelet.server.serve import serve_app

        trio.run(partial(serve_app, app, "127.0.0.1", port))


if __name__ == "__main__":
    main()

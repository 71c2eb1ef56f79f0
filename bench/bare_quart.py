"""The framework floor for bench_http.py: a Quart-Trio app on Hypercorn with one route.

``GET /healthz`` answers ``ok`` and nothing else runs in the process, so the latency the same
clients measure here is what Quart-Trio, Hypercorn, trio and the client cost on this machine
before the kubelet does anything. Usage: ``python bench/bare_quart.py PORT``.
"""

from __future__ import annotations

import sys

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

app = QuartTrio(__name__)


@app.route("/healthz")
async def healthz() -> str:
    return "ok"


def main() -> None:
    config = Config()
    config.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    config.accesslog = None
    trio.run(serve, app, config)


if __name__ == "__main__":
    main()

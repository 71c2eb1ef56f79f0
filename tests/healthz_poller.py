"""Ask a healthz port every ``interval`` for at most ``seconds`` (or until SIGTERM), from a
process of its own, and print each answer's latency (JSON): the agent's event loop is
measured from outside it, undisturbed by the agent's own threads.

Usage: ``python tests/healthz_poller.py PORT SECONDS [INTERVAL]``. One keep-alive connection
(reopened if the server closes it); a request that fails or takes over 5 s counts as an error.
Prints ``{"latencies_ms": [...], "errors": N, "statuses": {...}}``.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections import Counter

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _answer(conn: socket.socket) -> int:
    """Read one response (headers and a Content-Length body); its status code."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return int(head.split(b" ", 2)[1])


def poll(port: int, seconds: float, interval: float) -> dict[str, object]:
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    errors = 0
    conn: socket.socket | None = None
    end = time.monotonic() + seconds
    stopped: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped.append(signum))
    while (now := time.monotonic()) < end and not stopped:
        try:
            if conn is None:
                conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            began = time.perf_counter()
            conn.sendall(REQUEST)
            statuses[_answer(conn)] += 1
            latencies.append((time.perf_counter() - began) * 1000)
        except OSError:
            errors += 1
            if conn is not None:
                conn.close()
            conn = None
        time.sleep(max(0.0, now + interval - time.monotonic()))
    if conn is not None:
        conn.close()
    return {"latencies_ms": latencies, "errors": errors, "statuses": dict(statuses)}


if __name__ == "__main__":
    port, seconds = int(sys.argv[1]), float(sys.argv[2])
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    print(json.dumps(poll(port, seconds, interval)))

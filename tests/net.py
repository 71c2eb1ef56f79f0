"""TCP ports on 127.0.0.1 for tests: a free one, for servers a test starts (never the
kubelet's fixed ports), and one taken, for a server that must fail to start."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def taken_port() -> Iterator[int]:
    """A port something else listens on, for the block."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])

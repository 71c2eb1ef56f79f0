"""Serve the fake CRI runtime on a unix socket until SIGTERM/SIGINT (a helper for benchmarks).

Runs in its own process so that a benchmark measuring the agent does not count the runtime's CPU.
Prints ``ready <socket>`` on stdout once the socket accepts calls. Images named with ``--image``
are present from the start (others are "pulled" on demand, instantly).

Usage: ``python bench/fake_runtime_server.py SOCKET [--image REF]...``.

The GC benchmarks import ``fake_process`` instead: a fake filled in advance, served from a
forked child on a plain asyncio loop.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from trio_kubelet.runtime.fake import FakeRuntime, serve_fake_runtime, serve_fake_runtime_on_asyncio

DEFAULT_IMAGES = ("docker.io/library/busybox:1.36", "registry.k8s.io/pause:3.9")


async def serve(socket: Path, images: list[str]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with serve_fake_runtime(socket) as fake:
            for image in images:
                fake.add_image(image)
            print(f"ready {socket}", flush=True)
            async for _ in signals:
                break
            total = sum(fake.calls.values())
            print(f"stopping after {total} calls: {dict(fake.calls.most_common())}",
                  file=sys.stderr, flush=True)


@contextmanager
def fake_process(sock: str, populate: Callable[[FakeRuntime], None], *,
                 clock: Callable[[], float] = time.time) -> Iterator[int]:
    """A fake runtime filled by ``populate``, served on ``sock`` by a child process; its pid.

    The child serves from a plain asyncio loop (the fake answering on it directly), so the
    runtime side answers as fast as one process can and the figures are the agent's.
    """
    context = multiprocessing.get_context("fork")  # before any trio loop runs in this process
    ready, done = context.Event(), context.Event()

    def serve() -> None:
        fake = FakeRuntime(clock)
        populate(fake)
        serve_fake_runtime_on_asyncio(fake, sock, started=ready.set, done=done.is_set)

    child = context.Process(target=serve)
    child.start()
    try:
        if not ready.wait(300):
            raise RuntimeError("the fake runtime did not start")
        assert child.pid is not None
        yield child.pid
    finally:
        done.set()
        child.join(10)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("socket", type=Path, help="unix socket path (shorter than 108 bytes)")
    parser.add_argument("--image", action="append", dest="images",
                        help=f"image present from the start (default: {', '.join(DEFAULT_IMAGES)})")
    args = parser.parse_args()
    trio.run(serve, args.socket, args.images or list(DEFAULT_IMAGES))


if __name__ == "__main__":
    main()

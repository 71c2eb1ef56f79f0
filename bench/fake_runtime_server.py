"""Serve the fake CRI runtime on a unix socket until SIGTERM/SIGINT (a helper for benchmarks).

Runs in its own process so that a benchmark measuring the agent does not count the runtime's CPU.
Prints ``ready <socket>`` on stdout once the socket accepts calls. Images named with ``--image``
are present from the start (others are "pulled" on demand, instantly).

Usage: ``python bench/fake_runtime_server.py SOCKET [--image REF]...``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import trio

from trio_kubelet.runtime.fake import serve_fake_runtime

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("socket", type=Path, help="unix socket path (shorter than 108 bytes)")
    parser.add_argument("--image", action="append", dest="images",
                        help=f"image present from the start (default: {', '.join(DEFAULT_IMAGES)})")
    args = parser.parse_args()
    trio.run(serve, args.socket, args.images or list(DEFAULT_IMAGES))


if __name__ == "__main__":
    main()

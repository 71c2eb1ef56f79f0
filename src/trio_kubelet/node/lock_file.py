"""--lock-file and --exit-on-lock-contention: one kubelet per node, and a hand-over.

With a lock file the agent takes an exclusive flock on it before anything else, waiting while
another process (a kubelet) holds it. With --exit-on-lock-contention it then leaves as soon as
another process opens the file (inotify), so that a new kubelet waiting for the lock takes
over: pods keep running and the new one adopts them. The Go kubelet's flags, same behaviour.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from trio_kubelet.inotify import Inotify

__all__ = ["exit_on_contention", "held_lock_file"]

log = logging.getLogger(__name__)

_OPEN = 0x20  # IN_OPEN


@asynccontextmanager
async def held_lock_file(path: Path | None) -> AsyncIterator[None]:
    """An exclusive flock on ``path`` (created if missing) for the block, taken once the
    holder before us lets go; nothing when ``path`` is None."""
    if path is None:
        yield
        return
    log.info("Acquiring file lock on %s", path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        await trio.to_thread.run_sync(fcntl.flock, fd, fcntl.LOCK_EX, abandon_on_cancel=True)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


async def exit_on_contention(path: Path, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` (stop the agent) once another process opens or removes ``path``."""
    inotify = Inotify()
    try:
        inotify.add_watch(os.fsencode(path), _OPEN | Inotify.DELETE_SELF)
        log.info("Watching the lock file %s: another kubelet opening it stops this one", path)
        while not inotify.read():
            await trio.lowlevel.wait_readable(inotify.fd)
    finally:
        inotify.close()
    log.info("Another process opened the lock file %s: exiting for it", path)
    scope.cancel()

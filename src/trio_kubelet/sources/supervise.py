"""Keeping a source running: an exception it raises is logged, and the source started again.

A source turns the world into events; whatever the world holds (a manifest nobody
foresaw, an odd answer from the runtime or the API server), a bug it trips over must
not end the agent, whose other pods keep running. Each source contains what it
expects (a bad manifest is that file's problem); this is the net under everything else.
Cancellation (BaseException) passes through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger(__name__)

RESTART_DELAY_INITIAL = 1.0
RESTART_DELAY_MAX = 60.0
# A source that ran this long before failing starts again after the initial delay.
HEALTHY_RUN = 60.0

Source = Callable[..., Awaitable[None]]


class _StartedOnce:
    """The caller's task status, reported to once however many times the source starts."""

    def __init__(self, status: trio.TaskStatus[None]) -> None:
        self._status = status
        self._started = False

    def started(self, value: None = None) -> None:
        if not self._started:
            self._started = True
            self._status.started(value)


async def supervise(
    name: str,
    source: Source,
    send: trio.MemorySendChannel[Any],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``source(channel, task_status=...)`` until cancelled or it returns; when it raises,
    log the exception with its traceback and start it again, after a delay doubling from
    ``RESTART_DELAY_INITIAL`` to ``RESTART_DELAY_MAX``.

    Each run gets its own clone of ``send`` (a source may close its channel when it
    ends); ``task_status.started()`` is passed on the first time a run reports it.
    """
    status = _StartedOnce(task_status)
    delay = RESTART_DELAY_INITIAL
    async with send:
        while True:
            began = trio.current_time()
            channel = send.clone()
            try:
                await source(channel, task_status=status)
                return
            except Exception:
                if trio.current_time() - began >= HEALTHY_RUN:
                    delay = RESTART_DELAY_INITIAL
                log.exception("Source %s failed; starting it again in %g s", name, delay)
            finally:
                channel.close()
            await trio.sleep(delay)
            delay = min(delay * 2, RESTART_DELAY_MAX)

"""One asyncio event loop in a worker thread, for the asyncio-only library grpclib.

Trio tasks hand it coroutines (`AsyncioThread.run`) and wait for their results without
blocking the trio thread. Everything grpclib owns (channels, servers, their connections)
is created and used on that one loop only, so none of it needs a lock; the cost of a call
is two cross-thread wake-ups (bench/README.md compares it with trio-asyncio, used before).

A worker thread is invisible to trio's MockClock (it would jump the virtual clock while a
call runs): code under a MockClock talks to the in-process fake runtime on trio instead
(``runtime/fake.py``, `FakeTransport`).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager, suppress
from typing import Any, NoReturn, TypeVar

import outcome
import trio

__all__ = ["AsyncioThread", "open_asyncio_thread"]

T = TypeVar("T")


class AsyncioThread:
    """Runs coroutines on its asyncio loop for trio callers; get one from `open_asyncio_thread`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken) -> None:
        self._loop = loop
        self._token = token

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``await make()`` on the asyncio loop; its result or exception.

        Cancelling the caller cancels the asyncio task and waits for it to unwind, so
        nothing of the call outlives it.
        """
        waiter = trio.lowlevel.current_task()
        raise_cancel: list[Callable[[], NoReturn]] = []  # set when trio cancels the caller
        tasks: list[asyncio.Task[T]] = []

        def wake(task: asyncio.Task[T]) -> None:  # back in trio
            done = outcome.capture(raise_cancel[0]) if raise_cancel else outcome.capture(
                task.result)
            trio.lowlevel.reschedule(waiter, done)

        def start() -> None:  # on the asyncio loop
            task = self._loop.create_task(make(), context=contextvars.Context())
            tasks.append(task)
            if raise_cancel:
                task.cancel()
            task.add_done_callback(lambda t: self._token.run_sync_soon(wake, t))

        def cancel_tasks() -> None:  # on the asyncio loop
            for task in tasks:
                task.cancel()

        def abort(cancel: Callable[[], NoReturn]) -> trio.lowlevel.Abort:
            raise_cancel.append(cancel)
            self._loop.call_soon_threadsafe(cancel_tasks)
            return trio.lowlevel.Abort.FAILED  # wake() reschedules once the task is done

        self._loop.call_soon_threadsafe(start)
        result: T = await trio.lowlevel.wait_task_rescheduled(abort)
        return result


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The worker thread: run the loop until stopped, then finish what is left on it."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


@asynccontextmanager
async def open_asyncio_thread() -> AsyncIterator[AsyncioThread]:
    """Start a loop in a worker thread for the block; stop it and join the thread after."""
    loop = asyncio.new_event_loop()
    token = trio.lowlevel.current_trio_token()
    stopped = trio.Event()
    finished: list[outcome.Outcome[None]] = []

    def deliver(result: outcome.Outcome[None]) -> None:  # in the worker thread, at its end
        finished.append(result)
        with suppress(trio.RunFinishedError):
            token.run_sync_soon(stopped.set)

    trio.lowlevel.start_thread_soon(lambda: _run_loop(loop), deliver,
                                    name="trio-kubelet asyncio")
    try:
        yield AsyncioThread(loop, token)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        with trio.CancelScope(shield=True):
            await stopped.wait()
        finished[0].unwrap()

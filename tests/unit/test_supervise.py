"""A source that raises is logged and started again; the agent around it never sees it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from trio_kubelet.sources.supervise import RESTART_DELAY_MAX, supervise


class Flaky:
    """A source that sends its run number, reports started, then fails ``fail`` times."""

    def __init__(self, fail: int, *, before_started: bool = False, runs_for: float = 0.0) -> None:
        self.fail = fail
        self.before_started = before_started
        self.runs_for = runs_for
        self.starts: list[float] = []

    async def __call__(self, send: trio.MemorySendChannel[Any], *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts.append(trio.current_time())
        run = len(self.starts)
        async with send:
            failing = run <= self.fail
            if failing and self.before_started:
                raise RuntimeError(f"broken before starting, run {run}")
            await send.send(run)
            task_status.started()
            await trio.sleep(self.runs_for)
            if failing:
                raise ValueError(f"malformed input, run {run}")
            await trio.sleep_forever()


async def test_a_failing_source_is_logged_and_started_again(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    source = Flaky(fail=3)
    send, receive = trio.open_memory_channel[Any](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "flaky", source, send)
        assert [await receive.receive() for _ in range(4)] == [1, 2, 3, 4]
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(source.starts, source.starts[1:], strict=False)]
    assert gaps == [1.0, 2.0, 4.0]
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failures] == [
        f"Source flaky failed; starting it again in {d:g} s" for d in (1, 2, 4)]
    assert all(r.exc_info and r.exc_info[0] is ValueError for r in failures)


async def test_started_waits_for_a_run_that_gets_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source = Flaky(fail=2, before_started=True)
    send, receive = trio.open_memory_channel[Any](10)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "early", source, send)
        assert len(source.starts) == 3 and await receive.receive() == 3
        nursery.cancel_scope.cancel()


async def test_the_delay_is_capped_and_reset_after_a_healthy_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source = Flaky(fail=20)
    send, _receive = trio.open_memory_channel[Any](100)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "flaky", source, send)
        await trio.sleep(400)
        source.runs_for = 61.0  # from now on each run lasts a while before it fails
        await trio.sleep(400)
        nursery.cancel_scope.cancel()
    gaps = [round(b - a) for a, b in zip(source.starts, source.starts[1:], strict=False)]
    assert gaps[:7] == [1, 2, 4, 8, 16, 32, RESTART_DELAY_MAX]
    assert gaps[-1] == 61 + 1  # healthy for a minute: back to the first delay


async def test_cancellation_is_not_a_failure(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    source = Flaky(fail=0)
    send, _receive = trio.open_memory_channel[Any](10)
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, "steady", source, send)
    assert len(source.starts) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

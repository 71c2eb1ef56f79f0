"""node/shutdown.py's logind watch against a fake bus: the delay raised (or the watch refused),
the inhibitor lock taken, released once the pods have stopped and taken again after a
cancellation, a lost connection made again, and SIGTERM's meaning either way."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from tests.unit.test_core_shutdown import FakeNode, pod
from trio_kubelet.config import KubeletConfiguration
from trio_kubelet.node.logind import LogindError
from trio_kubelet.node.shutdown import BusSignal, NodeShutdownManager

GRACE, CRITICAL = 30, 10


@dataclass
class Signal:
    body: tuple[object, ...]


@dataclass
class Lock:
    """A lock as logind hands it out: a pipe whose write end the agent holds; logind sees the
    read end at EOF once the agent has closed it."""

    read: int
    write: int

    def released(self) -> bool:
        os.set_blocking(self.read, False)
        try:
            return os.read(self.read, 1) == b""
        except BlockingIOError:
            return False


@dataclass
class FakeLogind:
    """logind's side of one connection: its delay (one value per read, the last repeated),
    the locks it gave, the drop-ins written, the reloads asked."""

    delays_usec: list[int]
    locks: list[Lock] = field(default_factory=list)
    overrides: list[int] = field(default_factory=list)
    reloads: int = 0
    send: trio.MemorySendChannel[BusSignal] | None = None

    async def inhibit_delay_usec(self) -> int:
        return self.delays_usec.pop(0) if len(self.delays_usec) > 1 else self.delays_usec[0]

    async def inhibit_shutdown(self) -> int:
        read, write = os.pipe()
        self.locks.append(Lock(read, write))
        return write

    async def reload_logind_conf(self) -> None:
        self.reloads += 1

    async def override_inhibit_delay(self, seconds: int) -> object:
        self.overrides.append(seconds)
        return f"/etc/systemd/logind.conf.d/99-kubelet.conf ({seconds}s)"

    async def prepare_for_shutdown(self) -> trio.MemoryReceiveChannel[BusSignal]:
        self.send, receive = trio.open_memory_channel[BusSignal](16)
        return receive

    async def signal(self, *body: object) -> None:
        assert self.send is not None
        await self.send.send(Signal(body))

    def close(self) -> None:
        for lock in self.locks:
            os.close(lock.read)


@pytest.fixture
def logind() -> Iterator[FakeLogind]:
    fake = FakeLogind([GRACE * 1_000_000])
    yield fake
    fake.close()


def connector(logind: FakeLogind) -> Callable[[], AbstractAsyncContextManager[FakeLogind]]:
    @asynccontextmanager
    async def connect() -> AsyncIterator[FakeLogind]:
        yield logind

    return connect


def manager() -> NodeShutdownManager:
    config = KubeletConfiguration(
        shutdown_grace_period=GRACE, shutdown_grace_period_critical_pods=CRITICAL
    )
    return NodeShutdownManager(config, "n1")


def node() -> FakeNode:
    return FakeNode([pod("web"), pod("dns", priority=2_000_001_000)], {"web": 3, "dns": 2})


async def test_a_shutdown_stops_the_pods_then_releases_the_lock_and_a_cancellation_takes_one(
    autojump_clock: trio.testing.MockClock, logind: FakeLogind
) -> None:
    shutdown, fake = manager(), node()
    assert shutdown.sigterm_shuts_down
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: shutdown.watch_logind(
            fake, fake.stopped, fake.send, connect=connector(logind), task_status=task_status))
        assert shutdown.logind and not shutdown.sigterm_shuts_down  # SIGTERM: the agent only
        assert logind.overrides == [] and logind.reloads == 0  # 30 s is enough already
        [first] = logind.locks
        assert not first.released()

        start = trio.current_time()
        await logind.signal(True)
        while not first.released():
            await trio.sleep(0.1)
        released_after = trio.current_time() - start
        kills = [(uid, grace, when - start) for uid, grace, _, when in fake.kills]
        assert kills == [("web", 20, 0), ("dns", 10, pytest.approx(3, abs=0.3))]
        # The lock goes once both rounds' pods have stopped (3 s, then 2 s), not before.
        assert released_after == pytest.approx(5, abs=0.5)
        assert shutdown.shutdown_error() == "node is shutting down"

        await logind.signal(False)
        while len(logind.locks) < 2:
            await trio.sleep(0.1)
        assert shutdown.shutdown_error() is None
        assert fake.conditions == [("shutdown", ("NodeShutdown",)), ("shutdown", ())]
        assert not logind.locks[1].released()
        nursery.cancel_scope.cancel()
    assert logind.locks[1].released()  # the agent's end lets it go


async def test_a_short_delay_is_raised_by_the_drop_in_and_a_reload(
    autojump_clock: trio.testing.MockClock, logind: FakeLogind
) -> None:
    logind.delays_usec = [5_000_000, 5_000_000, 5_000_000, 30_000_000]
    shutdown, fake = manager(), node()
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(lambda task_status: shutdown.watch_logind(
            fake, fake.stopped, fake.send, connect=connector(logind), task_status=task_status))
        # Read, then after the reload: 5 s, 5 s (0.1 s later), 30 s (0.2 s later).
        assert trio.current_time() - start == pytest.approx(0.3)
        assert (logind.overrides, logind.reloads, len(logind.locks)) == ([30], 1, 1)
        assert shutdown.logind
        nursery.cancel_scope.cancel()


async def test_a_delay_logind_keeps_short_leaves_the_signal_to_sigterm(
    autojump_clock: trio.testing.MockClock, logind: FakeLogind, caplog: pytest.LogCaptureFixture
) -> None:
    logind.delays_usec = [5_000_000]
    shutdown, fake = manager(), node()
    start = trio.current_time()
    await shutdown.watch_logind(fake, fake.stopped, fake.send, connect=connector(logind))
    assert trio.current_time() - start == pytest.approx(1.5)  # 5 reads, 0.1 s doubling between
    assert (logind.overrides, logind.reloads, logind.locks) == ([30], 1, [])
    assert not shutdown.logind and shutdown.sigterm_shuts_down
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error == (
        "Failed to start node shutdown manager: node shutdown manager was timed out after 5 "
        "attempts waiting for logind InhibitDelayMaxSec to update to 30s (ShutdownGracePeriod), "
        "current value is 5s; graceful node shutdown is triggered by SIGTERM to the agent instead"
    )


async def test_no_system_bus_is_logged_once_and_leaves_the_signal_to_sigterm(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts = []

    @asynccontextmanager
    async def no_bus() -> AsyncIterator[FakeLogind]:
        attempts.append(1)
        raise LogindError("cannot connect to the system bus: [Errno 2] No such file or directory")
        yield  # pragma: no cover

    shutdown, fake = manager(), node()
    await shutdown.watch_logind(fake, fake.stopped, fake.send, connect=no_bus)
    assert attempts == [1] and shutdown.sigterm_shuts_down
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "Failed to start node shutdown manager: cannot connect to the system bus: [Errno 2] No "
        "such file or directory; graceful node shutdown is triggered by SIGTERM to the agent "
        "instead"
    ]


async def test_a_lost_connection_is_made_again_a_second_later_with_a_new_lock(
    autojump_clock: trio.testing.MockClock, logind: FakeLogind
) -> None:
    shutdown, fake = manager(), node()
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: shutdown.watch_logind(
            fake, fake.stopped, fake.send, connect=connector(logind), task_status=task_status))
        assert logind.send is not None
        await logind.send.aclose()  # the bus went away
        lost = trio.current_time()
        while len(logind.locks) < 2:
            await trio.sleep(0.05)
        assert trio.current_time() - lost == pytest.approx(1.0, abs=0.1)
        # The old lock is kept until the new one is held, then let go.
        assert logind.locks[0].released() and not logind.locks[1].released()
        await logind.signal("not a boolean")  # logged and ignored
        await logind.signal(True)
        while not logind.locks[1].released():
            await trio.sleep(0.1)
        assert [uid for uid, *_ in fake.kills] == ["web", "dns"]
        nursery.cancel_scope.cancel()

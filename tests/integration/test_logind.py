"""The node shutdown's logind watch (node/shutdown.py over node/logind.py) against the real
systemd-logind on a private system bus (tests/logind_fixture.py): InhibitDelayMaxSec raised
through Go's drop-in and a reload, the inhibitor lock as logind lists it, let go after
PrepareForShutdown(true) once the pods have stopped, taken again after PrepareForShutdown(false);
and the reasons logged when logind or systemd's manager is not there. The pods are the unit
tests' fake node (the whole agent on containerd: tests/e2e/test_node_shutdown.py)."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.logind_fixture import Logind, SystemdStandIn, running_logind
from tests.unit.test_core_shutdown import FakeNode, pod
from trio_kubelet.config import KubeletConfiguration
from trio_kubelet.node.logind import LogindError, open_logind
from trio_kubelet.node.shutdown import NodeShutdownManager

GRACE, CRITICAL = 6, 2  # above logind's default 5 s
LOCK = ("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay", os.getpid())


@pytest.fixture
def clean_runtime() -> None:
    """No containerd in these tests (the conftest's fixture of that name resets it)."""


@pytest.fixture
def logind() -> Iterator[Logind]:
    # A short directory: the bus socket's path must fit in sun_path.
    with tempfile.TemporaryDirectory(prefix="tk-logind-") as root, running_logind(
        Path(root)
    ) as running:
        yield running


def manager() -> NodeShutdownManager:
    config = KubeletConfiguration(
        shutdown_grace_period=GRACE, shutdown_grace_period_critical_pods=CRITICAL
    )
    return NodeShutdownManager(config, "logind-node")


async def until(predicate: Callable[[], bool], what: str, timeout: float = 15) -> float:
    """Poll ``predicate`` (a blocking call, in a thread) until true; when it became so."""
    with trio.move_on_after(timeout):
        while not await trio.to_thread.run_sync(predicate):
            await trio.sleep(0.05)
        return trio.current_time()
    raise AssertionError(f"not {what} after {timeout}s")


async def test_the_lock_is_held_released_after_the_pods_and_taken_again_on_cancellation(
    logind: Logind,
) -> None:
    assert logind.inhibit_delay_usec() == 5_000_000 and logind.inhibitors() == []
    shutdown = manager()
    node = FakeNode([pod("web"), pod("dns", priority=2_000_001_000)], {"web": 1, "dns": 1})
    systemd = SystemdStandIn(logind)
    async with trio.open_nursery() as nursery:
        await nursery.start(systemd.serve)
        connect = partial(open_logind, logind.address, logind.conf_dir)
        await nursery.start(partial(shutdown.watch_logind, node, node.stopped, node.send,
                                    connect=connect))
        # logind's 5 s were below the 6 s: Go's drop-in, a SIGHUP through systemd, and the
        # real logind now says 6 s.
        assert shutdown.logind
        assert (logind.conf_dir / "99-kubelet.conf").read_text() == (
            "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=6\n"
        )
        assert systemd.calls == [("systemd-logind.service", "all", signal.SIGHUP)]
        assert logind.inhibit_delay_usec() == 6_000_000
        assert logind.inhibitors() == [LOCK]

        start = trio.current_time()
        await trio.to_thread.run_sync(logind.prepare_for_shutdown, True)
        released = await until(lambda: logind.inhibitors() == [], "released")
        kills = {uid: when for uid, _, _, when in node.kills}
        assert list(kills) == ["web", "dns"]  # regular pods first, critical ones after
        assert kills["dns"] - kills["web"] >= 0.9  # once "web" had stopped
        assert released >= kills["dns"] + 0.9  # the machine may go once "dns" has stopped
        assert released - start < GRACE
        assert shutdown.shutdown_error() == "node is shutting down"

        await trio.to_thread.run_sync(logind.prepare_for_shutdown, False)
        await until(lambda: logind.inhibitors() == [LOCK], "locked again")
        assert shutdown.shutdown_error() is None
        assert node.conditions == [("shutdown", ("NodeShutdown",)), ("shutdown", ())]
        nursery.cancel_scope.cancel()
    assert logind.inhibitors() == []  # an agent that stops lets its lock go


async def refused_start(logind: Logind, caplog: pytest.LogCaptureFixture) -> str:
    """Start the watch where it cannot start: the one error it logs; no lock, SIGTERM on."""
    shutdown = manager()
    node = FakeNode([], {})
    await shutdown.watch_logind(node, node.stopped, node.send,
                                connect=partial(open_logind, logind.address, logind.conf_dir))
    assert not shutdown.logind and shutdown.sigterm_shuts_down
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    return error


async def test_without_systemds_manager_a_short_delay_cannot_be_raised(
    logind: Logind, caplog: pytest.LogCaptureFixture
) -> None:
    error = await refused_start(logind, caplog)
    assert error.startswith(
        "Failed to start node shutdown manager: unable to reload logind conf: "
        "org.freedesktop.DBus.Error.ServiceUnknown: "
    ), error
    assert logind.inhibitors() == []


async def test_without_logind_on_the_bus_the_reason_is_logged_once(
    logind: Logind, caplog: pytest.LogCaptureFixture
) -> None:
    os.kill(logind.pid, signal.SIGTERM)
    await until(lambda: os.waitpid(logind.pid, os.WNOHANG)[0] != 0, "logind stopped")
    error = await refused_start(logind, caplog)
    assert error.startswith(
        "Failed to start node shutdown manager: failed reading InhibitDelayMaxUSec property "
        "from logind: org.freedesktop.DBus.Error.ServiceUnknown: "
    ), error


async def test_a_bus_that_goes_away_ends_the_connection_with_a_logind_error(
    logind: Logind,
) -> None:
    with pytest.raises(LogindError, match=r"^the system bus connection ended: "):
        async with open_logind(logind.address, logind.conf_dir) as bus:
            fd = await bus.inhibit_shutdown()
            assert not os.get_inheritable(fd)  # no child of the agent keeps the lock
            os.close(fd)
            signals = await bus.prepare_for_shutdown()
            os.kill(logind.bus_pid, signal.SIGTERM)
            async for _ in signals:
                pass

"""Graceful node shutdown: on the node's shutdown signal, report the node not ready, refuse new
pods, and stop the running ones in rounds within the configured budget (Go's nodeshutdown
manager; ``core/shutdown.py`` decides the rounds).

The signal is systemd-logind's, as in Go: the agent holds a delay inhibitor lock on shutdown and
follows logind's PrepareForShutdown (``node/logind.py`` makes the bus calls, ``core/logind.py``
decides); True stops the pods and then releases the lock so the machine can go down, False (the
shutdown was cancelled) makes the node Ready and admitting again and takes a new lock. Where
there is no system bus or no logind, the reason is logged once and SIGTERM to the agent is the
signal instead (the agent exits once its pods have stopped).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import trio

from trio_kubelet.config import KubeletConfiguration
from trio_kubelet.core.logind import (
    DBUS_RECONNECT_PERIOD,
    RELOAD_CHECK_PAUSES,
    needs_override,
    override_failed,
    prepare_for_shutdown,
)
from trio_kubelet.core.shutdown import (
    CANCELLED_EVENT_MESSAGE,
    NODE_SHUTDOWN,
    SHUTDOWN_EVENT_MESSAGE,
    SHUTDOWN_MESSAGE,
    SHUTDOWN_REASON,
    SHUTTING_DOWN_ERROR,
    ShutdownRound,
    assign_rounds,
    pod_grace,
    shutdown_rounds,
    total_grace,
)
from trio_kubelet.events import Event, EvictPod, NodeConditions
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.model.pod import Pod
from trio_kubelet.node.logind import LogindError, open_logind, release_inhibit_lock

log = logging.getLogger(__name__)

# How often a round looks whether its pods have stopped.
STOPPED_POLL = 0.2
# How long the final reports (pod statuses, the node's) may take once the pods have stopped.
REPORT_TIMEOUT = 10.0
# PrepareForShutdown values waiting while a shutdown is handled.
SIGNAL_QUEUE = 16

Send = Callable[[Event], Awaitable[None]]


class ShutdownPods(Protocol):
    """What the shutdown reads of the sync loop: the pods to stop."""

    def active_pods(self) -> list[Pod]: ...


class BusSignal(Protocol):
    """A signal as it came over the bus: its arguments."""

    @property
    def body(self) -> tuple[object, ...]: ...


class Inhibitor(Protocol):
    """What the shutdown needs of logind (``node/logind.py``'s LogindBus on the system bus)."""

    async def inhibit_delay_usec(self) -> int: ...

    async def inhibit_shutdown(self) -> int: ...

    async def reload_logind_conf(self) -> None: ...

    async def override_inhibit_delay(self, seconds: int) -> object: ...

    async def prepare_for_shutdown(self) -> AsyncIterator[BusSignal]: ...


ConnectLogind = Callable[[], AbstractAsyncContextManager[Inhibitor]]


@dataclass(frozen=True)
class ShutdownReports:
    """How the cluster side hears of a shutdown: ``node_changed`` sends the node status soon
    (NotReady, or Ready after a cancellation); ``pods_stopped`` sends the pods' final statuses
    and the node's."""

    node_changed: Callable[[], None]
    pods_stopped: Callable[[], Awaitable[None]]


class NodeShutdownManager:
    """Takes the node's shutdown signal and runs the shutdown; tells the node status and
    admission while it does."""

    def __init__(
        self,
        config: KubeletConfiguration,
        node_name: str,
        *,
        events: EventRecorder | None = None,
    ) -> None:
        self.rounds: tuple[ShutdownRound, ...] = shutdown_rounds(
            config.shutdown_grace_period,
            config.shutdown_grace_period_critical_pods,
            [
                (entry.priority, entry.shutdown_grace_period_seconds)
                for entry in config.shutdown_grace_period_by_pod_priority
            ],
        )
        self.node_name = node_name
        self.events = events
        self.shutting_down = False
        self.reports: ShutdownReports | None = None  # set once the cluster side runs
        self.logind = False  # the signal comes from logind, not SIGTERM
        self._inhibitor: int | None = None  # the lock's fd
        self._bus: Inhibitor | None = None  # the live logind connection, for a new lock

    @property
    def enabled(self) -> bool:
        return bool(self.rounds)

    @property
    def sigterm_shuts_down(self) -> bool:
        """SIGTERM means the node is going down only where logind cannot say so (else, as for
        Go, it stops only the agent)."""
        return self.enabled and not self.logind

    def shutdown_error(self) -> str | None:
        """Why the node is not Ready: "node is shutting down" once it is."""
        return SHUTTING_DOWN_ERROR if self.shutting_down else None

    def _node_event(self, message: str) -> None:
        if self.events is not None:
            self.events.node_event(self.node_name, "Normal", NODE_SHUTDOWN, message)

    async def shut_down(
        self, pods: ShutdownPods, stopped: Callable[[str], bool], send: Send
    ) -> None:
        """Stop every active pod, round by round (lowest priority first): each pod with the
        round's grace (or its own, if shorter), the next round once all of this one have
        stopped or the round's grace has run out. ``send`` takes the sync loop's events; the
        cluster side's final reports get a while once the pods have stopped."""
        self.shutting_down = True
        await send(NodeConditions(source="shutdown", conditions=[NODE_SHUTDOWN]))
        log.info("Node shutdown: stopping pods within %ds (%s)", total_grace(self.rounds),
                 ", ".join(f"priority >= {r.priority}: {r.grace_seconds}s" for r in self.rounds))
        self._node_event(SHUTDOWN_EVENT_MESSAGE)
        if self.reports is not None:
            self.reports.node_changed()
        for round_, members in assign_rounds(self.rounds, pods.active_pods()):
            if not members:
                continue
            uids = []
            for pod in members:
                grace = pod_grace(pod, round_)
                log.info("Node shutdown: killing pod %s with grace %ds", pod.full_name, grace)
                await send(EvictPod(pod_uid=pod.metadata.uid, message=SHUTDOWN_MESSAGE,
                                    grace=grace, reason=SHUTDOWN_REASON))
                uids.append(pod.metadata.uid)
            with trio.move_on_after(round_.grace_seconds) as waited:
                while not all(stopped(uid) for uid in uids):
                    await trio.sleep(STOPPED_POLL)
            if waited.cancelled_caught:
                log.warning("Node shutdown: pods of priority >= %d still running after %ds",
                            round_.priority, round_.grace_seconds)
            else:
                log.info("Node shutdown: the %d pod(s) of priority >= %d have stopped",
                         len(uids), round_.priority)
        if self.reports is not None:
            with trio.move_on_after(REPORT_TIMEOUT):
                await self.reports.pods_stopped()
        log.info("Node shutdown: done")

    async def cancel(self, send: Send) -> None:
        """The shutdown was called off: the node is Ready and admits pods again (the pods
        already stopped stay stopped, as in Go)."""
        self.shutting_down = False
        await send(NodeConditions(source="shutdown", conditions=[]))
        log.info("Node shutdown: cancelled")
        self._node_event(CANCELLED_EVENT_MESSAGE)
        if self.reports is not None:
            self.reports.node_changed()

    # --- the signal from systemd-logind (Go's managerImpl.Start) -----------------------------

    async def watch_logind(
        self,
        pods: ShutdownPods,
        stopped: Callable[[str], bool],
        send: Send,
        *,
        connect: ConnectLogind = open_logind,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Follow logind's PrepareForShutdown for as long as the agent runs: started once the
        first connection holds its lock (or has failed: then the reason is logged once and
        SIGTERM stays the signal). A connection that ends is made again a second later."""
        signals_in, signals = trio.open_memory_channel[bool](SIGNAL_QUEUE)
        try:
            async with trio.open_nursery() as nursery:
                try:
                    await nursery.start(self._follow_logind, connect, signals_in)
                except LogindError as err:
                    log.error("Failed to start node shutdown manager: %s; graceful node "
                              "shutdown is triggered by SIGTERM to the agent instead", err)
                    task_status.started()
                    return
                self.logind = True
                task_status.started()
                async for shutting_down in signals:
                    await self._prepare_for_shutdown(shutting_down, pods, stopped, send)
        finally:
            self._release()

    async def _follow_logind(
        self,
        connect: ConnectLogind,
        signals: trio.MemorySendChannel[bool],
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """One connection after another: the lock, then each PrepareForShutdown's value to
        ``signals``. The first one's failure is raised; later ones are logged."""
        started = False
        async with signals:
            while True:
                try:
                    async with connect() as bus:
                        received = await self._hold_lock(bus)
                        if not started:
                            log.info("Node shutdown: holding a delay inhibitor lock of "
                                     "systemd-logind; following its PrepareForShutdown")
                            task_status.started()
                            started = True
                        await _forward(received, signals)
                    log.error("Ended watching the node for shutdown events")
                except LogindError as err:
                    if not started:
                        raise
                    log.error("Unable to watch the node for shutdown events: %s", err)
                finally:
                    self._bus = None
                await trio.sleep(DBUS_RECONNECT_PERIOD)
                log.info("Restarting watch for node shutdown events")

    async def _hold_lock(self, bus: Inhibitor) -> AsyncIterator[BusSignal]:
        """On a new connection: the signals subscribed to first (none is missed), logind's
        delay raised where it is short, then the lock."""
        received = await bus.prepare_for_shutdown()
        await self._check_inhibit_delay(bus)
        await self._take_lock(bus)
        self._bus = bus
        return received

    async def _check_inhibit_delay(self, bus: Inhibitor) -> None:
        """Raise logind's InhibitDelayMaxSec to the whole grace period where it is shorter."""
        requested = total_grace(self.rounds)
        current = await bus.inhibit_delay_usec()
        if not needs_override(requested, current):
            return
        path = await bus.override_inhibit_delay(requested)
        log.info("Node shutdown: logind's InhibitDelayMaxSec is %gs, below the grace period "
                 "(%ds): wrote %s and reloading logind", current / 1e6, requested, path)
        await bus.reload_logind_conf()
        for attempt, pause in enumerate((*RELOAD_CHECK_PAUSES, None), start=1):
            current = await bus.inhibit_delay_usec()
            if not needs_override(requested, current):
                return
            if pause is None:
                raise LogindError(override_failed(attempt, requested, current))
            await trio.sleep(pause)

    async def _take_lock(self, bus: Inhibitor) -> None:
        """A new inhibitor lock, then the old one (if any) let go."""
        fd = await bus.inhibit_shutdown()
        self._release()
        self._inhibitor = fd

    def _release(self) -> None:
        if self._inhibitor is not None:
            release_inhibit_lock(self._inhibitor)
            self._inhibitor = None

    async def _prepare_for_shutdown(
        self, shutting_down: bool, pods: ShutdownPods, stopped: Callable[[str], bool], send: Send
    ) -> None:
        """True: stop the pods, then let the machine go down (release the lock). False: the
        shutdown was cancelled: back to Ready, and a new lock for the next one."""
        log.info("Node shutdown: logind's PrepareForShutdown(%s)", str(shutting_down).lower())
        if shutting_down:
            await self.shut_down(pods, stopped, send)
            self._release()
            log.info("Node shutdown: inhibitor lock released, the node will shut down shortly")
            return
        await self.cancel(send)
        if self._bus is None:
            log.error("Node shutdown: no logind connection for a new inhibitor lock")
            return
        try:
            await self._take_lock(self._bus)
        except LogindError as err:
            log.error("Node shutdown: failed taking a new inhibitor lock: %s", err)


async def _forward(
    received: AsyncIterator[BusSignal], signals: trio.MemorySendChannel[bool]
) -> None:
    """Each PrepareForShutdown's value, until the connection ends; a malformed one is logged."""
    async for message in received:
        value = prepare_for_shutdown(message.body)
        if value is None:
            log.error("Failed obtaining shutdown event, PrepareForShutdown did not carry one "
                      "boolean")
        else:
            await signals.send(value)

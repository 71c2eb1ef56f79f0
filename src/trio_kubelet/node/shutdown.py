"""Graceful node shutdown: on the node's shutdown signal, report the node not ready, refuse new
pods, and stop the running ones in rounds within the configured budget (Go's nodeshutdown
manager; ``core/shutdown.py`` decides the rounds).

The signal here is SIGTERM to the agent, when ``shutdownGracePeriod`` (or
``shutdownGracePeriodByPodPriority``) is set; without it SIGTERM still stops only the agent. Go's
kubelet takes the signal from systemd-logind instead (a delay inhibitor lock and its
PrepareForShutdown D-Bus signal); that is not implemented: the machines this agent is tested on
run no logind, and a D-Bus client would be a new dependency.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from trio_kubelet.config import KubeletConfiguration
from trio_kubelet.core.shutdown import (
    NODE_SHUTDOWN,
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

log = logging.getLogger(__name__)

# How often a round looks whether its pods have stopped.
STOPPED_POLL = 0.2
# How long the final reports (pod statuses, the node's) may take once the pods have stopped.
REPORT_TIMEOUT = 10.0


class ShutdownPods(Protocol):
    """What the shutdown reads of the sync loop: the pods to stop."""

    def active_pods(self) -> list[Pod]: ...


class NodeShutdownManager:
    """Runs the shutdown once; tells the node status and admission while it does."""

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
        # Set when the node starts shutting down (the cluster side sends the node status at
        # once) and when its pods have stopped (the cluster side sends the pod statuses and
        # the node status, then sets ``reported``).
        self.started = trio.Event()
        self.pods_stopped = trio.Event()
        self.reported = trio.Event()

    @property
    def enabled(self) -> bool:
        return bool(self.rounds)

    def shutdown_error(self) -> str | None:
        """Why the node is not Ready: "node is shutting down" once it is."""
        return SHUTTING_DOWN_ERROR if self.shutting_down else None

    async def shut_down(
        self,
        pods: ShutdownPods,
        stopped: Callable[[str], bool],
        send: Callable[[Event], Awaitable[None]],
        *,
        await_reports: bool,
    ) -> None:
        """Stop every active pod, round by round (lowest priority first): each pod with the
        round's grace (or its own, if shorter), the next round once all of this one have
        stopped or the round's grace has run out. ``send`` takes the sync loop's events;
        with ``await_reports`` (a cluster side), wait a while for its final reports."""
        self.shutting_down = True
        await send(NodeConditions(source="shutdown", conditions=[NODE_SHUTDOWN]))
        log.info("Node shutdown: stopping pods within %ds (%s)", total_grace(self.rounds),
                 ", ".join(f"priority >= {r.priority}: {r.grace_seconds}s" for r in self.rounds))
        if self.events is not None:
            self.events.node_event(
                self.node_name, "Normal", NODE_SHUTDOWN, "Shutdown manager detected shutdown event"
            )
        self.started.set()
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
        self.pods_stopped.set()
        if await_reports:
            with trio.move_on_after(REPORT_TIMEOUT):
                await self.reported.wait()
        log.info("Node shutdown: done")

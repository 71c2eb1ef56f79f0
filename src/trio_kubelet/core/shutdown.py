"""Graceful node shutdown (Go's nodeshutdown manager): which pods go in which round, with what
grace, and what the node and its pods say meanwhile.

Pods are killed in rounds by priority, lowest first. ``shutdownGracePeriod`` and
``shutdownGracePeriodCriticalPods`` make two rounds: regular pods (priority below
system-critical's 2000000000) get the difference, critical pods the critical part;
``shutdownGracePeriodByPodPriority`` gives the rounds explicitly. A pod lands in the round of
the highest priority not above its own (the lowest round if there is none), and is killed with
the round's grace or its own terminationGracePeriodSeconds if shorter.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from trio_kubelet.model.pod import Pod

# Go's scheduling constants.
DEFAULT_PRIORITY = 0
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000

# What a pod killed for the shutdown shows (phase Failed, and a DisruptionTarget condition
# with reason TerminationByKubelet and the same message).
SHUTDOWN_REASON = "Terminated"
SHUTDOWN_MESSAGE = "Pod was terminated in response to imminent node shutdown."
# Admission while the node shuts down: the node state that refuses new pods, and the refusal.
NODE_SHUTDOWN = "NodeShutdown"
NOT_ADMITTED_MESSAGE = "Pod was rejected as the node is shutting down."
# Why the node is not Ready meanwhile.
SHUTTING_DOWN_ERROR = "node is shutting down"
# The node's events (reason NodeShutdown) when the shutdown starts and when it is cancelled.
SHUTDOWN_EVENT_MESSAGE = "Shutdown manager detected shutdown event"
CANCELLED_EVENT_MESSAGE = "Shutdown manager detected shutdown cancellation"


@dataclass(frozen=True, order=True)
class ShutdownRound:
    """Pods of at least ``priority`` (below the next round's) get ``grace_seconds``."""

    priority: int
    grace_seconds: int


def shutdown_rounds(
    grace_period: float,
    critical_grace_period: float,
    by_priority: Sequence[tuple[int, int]] = (),
) -> tuple[ShutdownRound, ...]:
    """The rounds a shutdown runs, sorted by priority; none when graceful shutdown is off.

    ``by_priority`` is ``shutdownGracePeriodByPodPriority`` as (priority, seconds); when empty
    the two periods make the regular and the critical round (none if the critical part is
    larger than the whole, as Go's migration gives none).
    """
    if by_priority:
        return tuple(sorted(ShutdownRound(p, s) for p, s in by_priority))
    if grace_period <= 0:
        return ()
    regular = grace_period - critical_grace_period
    if regular < 0:
        return ()
    return (
        ShutdownRound(DEFAULT_PRIORITY, int(regular)),
        ShutdownRound(SYSTEM_CRITICAL_PRIORITY, int(grace_period - regular)),
    )


def total_grace(rounds: Sequence[ShutdownRound]) -> int:
    """The whole budget: the rounds' graces added up."""
    return sum(r.grace_seconds for r in rounds)


def assign_rounds(
    rounds: Sequence[ShutdownRound], pods: Sequence[Pod]
) -> list[tuple[ShutdownRound, list[Pod]]]:
    """Each round with its pods, in the order they are killed (lowest priority first)."""
    ordered = sorted(rounds)
    groups: list[tuple[ShutdownRound, list[Pod]]] = [(r, []) for r in ordered]
    if not ordered:
        return groups
    priorities = [r.priority for r in ordered]
    for pod in pods:
        priority = pod.spec.priority or 0
        index = bisect.bisect_right(priorities, priority) - 1
        groups[max(index, 0)][1].append(pod)
    return groups


def pod_grace(pod: Pod, round_: ShutdownRound) -> int:
    """The round's grace, or the pod's own terminationGracePeriodSeconds when shorter."""
    return min(pod.spec.termination_grace_period_seconds, round_.grace_seconds)

"""How many seconds a container gets between SIGTERM and SIGKILL when it is killed.

``setTerminationGracePeriod`` and ``killContainer`` (kuberuntime_container.go). The
preStop hook's run time is subtracted by the caller, which then applies
:func:`at_least_minimum` again.
"""

from __future__ import annotations

from trio_kubelet.core.actions import REASON_LIVENESS_PROBE, REASON_STARTUP_PROBE
from trio_kubelet.model.pod import Container, Pod

MINIMUM_GRACE_PERIOD_SECONDS = 2


def at_least_minimum(seconds: int) -> int:
    """Never less than 2 s, so a container always gets a moment to handle SIGTERM."""
    return max(seconds, MINIMUM_GRACE_PERIOD_SECONDS)


def kill_grace_period(
    pod: Pod, container: Container | None, reason: str, override: int | None = None
) -> int:
    """The grace period for killing ``container`` for ``reason`` (a ContainerToKill reason).

    A pod being deleted uses its deletion grace period. Otherwise a liveness or
    startup probe kill uses that probe's ``terminationGracePeriodSeconds`` when set,
    and anything else the pod's. An explicit ``override`` (eviction, API force
    delete) replaces all of these; the 2 s floor applies last.
    """
    if override is not None:
        return at_least_minimum(override)
    deletion_grace = pod.metadata.deletion_grace_period_seconds
    if deletion_grace is not None:
        return at_least_minimum(deletion_grace)
    probe = None
    if container is not None:
        if reason == REASON_LIVENESS_PROBE:
            probe = container.liveness_probe
        elif reason == REASON_STARTUP_PROBE:
            probe = container.startup_probe
    if probe is not None and probe.termination_grace_period_seconds is not None:
        return at_least_minimum(probe.termination_grace_period_seconds)
    return at_least_minimum(pod.spec.termination_grace_period_seconds)

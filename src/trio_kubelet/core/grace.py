"""How many seconds a container gets between SIGTERM and SIGKILL when it is killed.

``setTerminationGracePeriod`` and ``killContainer`` (kuberuntime_container.go): the grace
period of a kill, what is left of it after the preStop hook and the wait for the
container's turn (sidecars), the 2 s floor applied last, and that termination order.
"""

from __future__ import annotations

from collections.abc import Collection

from trio_kubelet.core.actions import REASON_LIVENESS_PROBE, REASON_STARTUP_PROBE
from trio_kubelet.model.pod import Container, Pod, is_sidecar

MINIMUM_GRACE_PERIOD_SECONDS = 2


def at_least_minimum(seconds: int) -> int:
    """Never less than 2 s, so a container always gets a moment to handle SIGTERM."""
    return max(seconds, MINIMUM_GRACE_PERIOD_SECONDS)


def termination_grace_period(
    pod: Pod, container: Container | None, reason: str, override: int | None = None
) -> int:
    """The grace period a kill starts from, before the floor: the preStop hook runs only
    when it is above 0 and spends from it.

    A pod being deleted uses its deletion grace period. Otherwise a liveness or
    startup probe kill uses that probe's ``terminationGracePeriodSeconds`` when set,
    and anything else the pod's. An explicit ``override`` (eviction, API force
    delete) replaces all of these.
    """
    if override is not None:
        return override
    deletion_grace = pod.metadata.deletion_grace_period_seconds
    if deletion_grace is not None:
        return deletion_grace
    probe = None
    if container is not None:
        if reason == REASON_LIVENESS_PROBE:
            probe = container.liveness_probe
        elif reason == REASON_STARTUP_PROBE:
            probe = container.startup_probe
    if probe is not None and probe.termination_grace_period_seconds is not None:
        return probe.termination_grace_period_seconds
    return pod.spec.termination_grace_period_seconds


def kill_grace_period(
    pod: Pod, container: Container | None, reason: str, override: int | None = None
) -> int:
    """The grace period for killing ``container`` for ``reason`` when nothing spends from it."""
    return at_least_minimum(termination_grace_period(pod, container, reason, override))


def remaining_grace(grace: int, waited: float) -> int:
    """What is left of ``grace`` after ``waited`` seconds (a preStop hook, the sidecar order).

    Whole seconds waited count, as Go truncates them; the floor is for the caller to
    apply once all waiting is done (``at_least_minimum``).
    """
    return grace - int(waited)


def termination_prerequisites(pod: Pod, running: Collection[str]) -> dict[str, frozenset[str]]:
    """For each running sidecar, the running containers it must outlive when the pod stops.

    A sidecar waits for every regular container and for the sidecars declared after it
    (so sidecars stop in reverse order); everything else stops at once. Without
    sidecars the pod has no order at all (``terminationOrdering``).
    """
    sidecars = [c.name for c in pod.spec.init_containers if is_sidecar(c)]
    if not sidecars:
        return {}
    regular = frozenset(c.name for c in pod.spec.containers if c.name in running)
    order: dict[str, frozenset[str]] = {}
    later: frozenset[str] = frozenset()
    for name in reversed(sidecars):
        if name in running:
            order[name] = regular | later
            later = frozenset({name})
    return order

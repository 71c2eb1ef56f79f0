"""The probe worker's state machine (prober/worker.go), as pure functions.

A probe worker owns one probe (liveness, readiness or startup) of one container.
Each period it looks at the container as the pod's published status shows it
(``ProbeView``), decides whether to probe (``before_probe``), and after a probe
counts consecutive identical results (``after_probe``). A result is published
only once it has repeated ``failureThreshold``/``successThreshold`` times; the
shell turns published results into events for the reconciler.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from trio_kubelet.core.container_ids import runtime_id
from trio_kubelet.core.observed import ProbeResult
from trio_kubelet.core.timestamps import parse_time
from trio_kubelet.model.pod import Container, Pod, PodStatus, Probe, is_sidecar

_SUCCESS = ProbeResult.SUCCESS
_FAILURE = ProbeResult.FAILURE


class ProbeType(enum.Enum):
    LIVENESS = "liveness"
    READINESS = "readiness"
    STARTUP = "startup"

    @property
    def title(self) -> str:
        """As the Go kubelet words it in events: "Liveness", "Readiness", "Startup"."""
        return self.value.capitalize()


# What a new container instance starts with, before any probe ran (prober/worker.go).
INITIAL_RESULT = {
    ProbeType.LIVENESS: ProbeResult.SUCCESS,
    ProbeType.READINESS: ProbeResult.FAILURE,
    ProbeType.STARTUP: ProbeResult.UNKNOWN,
}


def probe_of(container: Container, probe_type: ProbeType) -> Probe | None:
    if probe_type is ProbeType.LIVENESS:
        return container.liveness_probe
    if probe_type is ProbeType.READINESS:
        return container.readiness_probe
    return container.startup_probe


def probed_containers(pod: Pod) -> list[tuple[Container, ProbeType, Probe]]:
    """Every (container, probe type, probe) of the pod that needs a worker.

    Regular containers and sidecars are probed; regular init containers and
    ephemeral containers are not (the API server rejects probes on them).
    """
    found: list[tuple[Container, ProbeType, Probe]] = []
    candidates = [c for c in pod.spec.init_containers if is_sidecar(c)] + pod.spec.containers
    for container in candidates:
        for probe_type in ProbeType:
            probe = probe_of(container, probe_type)
            if probe is not None:
                found.append((container, probe_type, probe))
    return found


@dataclass(frozen=True, slots=True)
class ProbeView:
    """What one tick sees of the probed container, from the pod's published status."""

    pod_terminal: bool = False
    pod_deleting: bool = False
    container_id: str = ""  # the runtime's ID without the ``containerd://`` prefix
    running: bool = False
    running_since: float = 0.0  # epoch seconds the running instance started
    started: bool = False  # the container's ``started`` (its startup probe succeeded)
    may_restart: bool = True  # a stopped container may run again


def probe_view(pod: Pod, status: PodStatus, container: Container) -> ProbeView:
    """The ``ProbeView`` of ``container`` in ``status`` (the pod's latest published status)."""
    terminal = status.phase in ("Failed", "Succeeded")
    deleting = pod.metadata.deletion_timestamp is not None
    statuses = [*status.init_container_statuses, *status.container_statuses]
    found = next((s for s in statuses if s.name == container.name), None)
    if found is None or not found.container_id:
        return ProbeView(terminal, deleting)
    running = found.state.running
    policy = pod.spec.restart_policy
    return ProbeView(
        pod_terminal=terminal,
        pod_deleting=deleting,
        container_id=runtime_id(found.container_id),
        running=running is not None,
        running_since=parse_time(running.started_at) if running is not None else 0.0,
        started=bool(found.started),
        may_restart=found.state.terminated is None or policy != "Never" or is_sidecar(container),
    )


@dataclass(frozen=True, slots=True)
class ProbeWorkerState:
    """What a worker remembers between ticks."""

    container_id: str = ""
    last_result: ProbeResult | None = None
    result_run: int = 0  # how many times in a row ``last_result`` came back
    on_hold: bool = False  # published a kill-worthy result: wait for a new instance


class Next(enum.Enum):
    PROBE = "probe"  # run the probe now
    WAIT = "wait"  # do nothing this tick; tick again next period
    STOP = "stop"  # the worker is done for good


@dataclass(frozen=True, slots=True)
class Tick:
    """One decision: the new state, what to do, and result changes to publish first.

    ``forget`` names a container ID whose published result must be dropped (an
    instance that was replaced); ``publish`` is a result for ``state.container_id``.
    """

    state: ProbeWorkerState
    next: Next
    publish: ProbeResult | None = None
    forget: str = ""


def before_probe(
    probe_type: ProbeType, probe: Probe, state: ProbeWorkerState, view: ProbeView, now: float
) -> Tick:
    """Whether this tick probes, following ``worker.doProbe`` up to the probe call."""
    if view.pod_terminal:
        return Tick(state, Next.STOP, forget=state.container_id)
    if not view.container_id:
        return Tick(state, Next.WAIT)
    forget = ""
    publish: ProbeResult | None = None
    if view.container_id != state.container_id:
        forget = state.container_id
        state = ProbeWorkerState(container_id=view.container_id)
        publish = INITIAL_RESULT[probe_type]
    if state.on_hold:
        return Tick(state, Next.WAIT, publish, forget)
    if not view.running:
        keep = Next.WAIT if view.may_restart else Next.STOP
        return Tick(state, keep, _FAILURE, forget)
    if view.pod_deleting and probe_type is not ProbeType.READINESS:
        # A pod on its way out must not be restarted by a late liveness failure.
        return Tick(state, Next.STOP, _SUCCESS, forget)
    if int(now - view.running_since) < probe.initial_delay_seconds:
        return Tick(state, Next.WAIT, publish, forget)
    if (probe_type is ProbeType.STARTUP) == view.started:
        # Startup probes run until the container has started; the others only after.
        return Tick(state, Next.WAIT, publish, forget)
    return Tick(state, Next.PROBE, publish, forget)


def after_probe(
    probe_type: ProbeType, probe: Probe, state: ProbeWorkerState, result: ProbeResult
) -> Tick:
    """Count the result; publish it once it has repeated its threshold (``worker.doProbe``)."""
    run = state.result_run + 1 if result is state.last_result else 1
    state = replace(state, last_result=result, result_run=run)
    threshold = probe.failure_threshold if result is _FAILURE else probe.success_threshold
    if run < threshold:
        return Tick(state, Next.WAIT)
    if probe_type is ProbeType.STARTUP or (
        probe_type is ProbeType.LIVENESS and result is _FAILURE
    ):
        # The container will be restarted (or has started): no more probing this instance.
        state = replace(state, on_hold=True, result_run=0)
    return Tick(state, Next.WAIT, result)


def initial_jitter(period: float, since_agent_start: float, fraction: float) -> float:
    """How long a new worker waits before its first tick.

    Only when the agent started less than one period ago (after a restart every
    adopted container's probes would otherwise fire at once); ``fraction`` is a
    random number in [0, 1) supplied by the caller.
    """
    return period * fraction if since_agent_start < period else 0.0


def next_tick(previous: float, now: float, period: float) -> float:
    """The first tick of the grid ``previous + k·period`` that is still ahead of ``now``.

    Ticks stay on a fixed grid like a Go ticker, so a late wake-up does not push
    every later probe back; ticks a slow probe overran are dropped, not bunched.
    """
    following = previous + period
    if following > now:
        return following
    return following + (math.floor((now - following) / period) + 1) * period

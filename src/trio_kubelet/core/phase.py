"""Pod phase and the pod status the kubelet reports, computed from the runtime's view.

``getPhase``, ``convertToAPIContainerStatuses`` and ``generateAPIPodStatus``
(kubelet_pods.go) with the condition generators of ``pkg/kubelet/status``, as pure
functions: the clock reading and probe results come in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from trio_kubelet.core.actions import pod_sandbox_changed, should_container_be_restarted
from trio_kubelet.core.container_ids import status_container_id
from trio_kubelet.core.observed import (
    ContainerState as RuntimeState,
)
from trio_kubelet.core.observed import (
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    SandboxState,
)
from trio_kubelet.core.qos import pod_qos_class
from trio_kubelet.core.timestamps import format_time
from trio_kubelet.model.pod import (
    Container,
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStateWaiting,
    ContainerStatus,
    Pod,
    PodCondition,
    PodIP,
    PodStatus,
    is_sidecar,
)
from trio_kubelet.model.quantity import QuantityError

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]

TERMINAL_PHASES: tuple[PodPhase, ...] = ("Succeeded", "Failed")
CONFIG_SOURCE_ANNOTATION = "kubernetes.io/config.source"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# Conditions the kubelet owns; any other condition in the pod's status is kept as is.
KUBELET_CONDITIONS = frozenset(
    {"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"}
)
CONTAINER_CREATING = "ContainerCreating"
POD_INITIALIZING = "PodInitializing"
READINESS_GATES_NOT_READY = "ReadinessGatesNotReady"
STATUS_UNKNOWN_REASON = "ContainerStatusUnknown"
# What all the terminated messages of one pod's status may add up to (kubecontainer).
MAX_POD_TERMINATION_MESSAGE_BYTES = 12 * 1024

_NO_ERRORS: Mapping[str, tuple[str, str]] = MappingProxyType({})
_NO_RESULTS: Mapping[str, ProbeResult] = MappingProxyType({})


def is_static_pod(pod: Pod) -> bool:
    """A pod from a manifest file or URL rather than from the API server."""
    source = pod.metadata.annotations.get(CONFIG_SOURCE_ANNOTATION)
    return source is not None and source != "api"


def _time_or_none(seconds: float) -> str | None:
    return format_time(seconds) if seconds else None


# -- phase -----------------------------------------------------------------------------


@dataclass(slots=True)
class _PhaseCounts:
    pending_init: int = 0
    failed_init: int = 0
    unknown: int = 0
    running: int = 0
    waiting: int = 0
    stopped: int = 0
    succeeded: int = 0


def _count_regular_init(counts: _PhaseCounts, status: ContainerStatus | None) -> None:
    if status is None or status.state.running is not None:
        counts.pending_init += 1
    elif status.state.terminated is not None:
        if status.state.terminated.exit_code != 0:
            counts.failed_init += 1
    elif status.state.waiting is not None and status.last_state.terminated is not None:
        if status.last_state.terminated.exit_code != 0:
            counts.failed_init += 1
    else:
        counts.pending_init += 1


def _count_sidecar(counts: _PhaseCounts, status: ContainerStatus | None) -> None:
    if status is None:
        counts.unknown += 1
    elif status.state.running is not None:
        if not status.started:
            counts.pending_init += 1
        counts.running += 1
    elif status.state.terminated is not None:
        return  # a stopped sidecar does not decide the phase
    elif status.state.waiting is not None:
        if status.last_state.terminated is None:
            counts.pending_init += 1
            counts.waiting += 1
    else:
        counts.pending_init += 1
        counts.unknown += 1


def _count_regular(counts: _PhaseCounts, status: ContainerStatus | None) -> None:
    if status is None:
        counts.unknown += 1
    elif status.state.running is not None:
        counts.running += 1
    elif status.state.terminated is not None:
        counts.stopped += 1
        if status.state.terminated.exit_code == 0:
            counts.succeeded += 1
    elif status.state.waiting is not None:
        if status.last_state.terminated is not None:
            counts.stopped += 1
        else:
            counts.waiting += 1
    else:
        counts.unknown += 1


def has_any_regular_container_started(pod: Pod, statuses: Mapping[str, ContainerStatus]) -> bool:
    """A regular container is running or has terminated: initialization happened."""
    for container in pod.spec.containers:
        status = statuses.get(container.name)
        if status is not None and (status.state.running or status.state.terminated):
            return True
    return False


def get_phase(
    pod: Pod, statuses: Sequence[ContainerStatus], *, pod_is_terminal: bool = False
) -> PodPhase:
    """``getPhase``: the pod phase from its init and regular container statuses."""
    by_name = {status.name: status for status in statuses}
    spec = pod.spec
    counts = _PhaseCounts()
    for container in spec.init_containers:
        if is_sidecar(container):
            _count_sidecar(counts, by_name.get(container.name))
        else:
            _count_regular_init(counts, by_name.get(container.name))
    for container in spec.containers:
        _count_regular(counts, by_name.get(container.name))
    if counts.failed_init > 0 and spec.restart_policy == "Never":
        return "Failed"
    if counts.waiting > 0 or (
        counts.pending_init > 0 and not has_any_regular_container_started(pod, by_name)
    ):
        return "Pending"
    if counts.running > 0 and counts.unknown == 0:
        return "Running"
    if counts.running == 0 and counts.stopped > 0 and counts.unknown == 0:
        return _phase_when_all_stopped(pod, counts, pod_is_terminal)
    return "Pending"


def _phase_when_all_stopped(
    pod: Pod, counts: _PhaseCounts, pod_is_terminal: bool
) -> PodPhase:
    all_succeeded = counts.stopped == counts.succeeded
    # A terminal pod's containers will not restart whatever the policy; static pods
    # are excluded, as in Go (kubernetes#116484), so a mirror pod never ends early.
    if pod_is_terminal and not is_static_pod(pod):
        return "Succeeded" if all_succeeded else "Failed"
    policy = pod.spec.restart_policy
    if policy == "Always":
        return "Running"
    if all_succeeded:
        return "Succeeded"
    if policy == "Never":
        return "Failed"
    return "Running"


# -- container statuses ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Context:
    pod: Pod
    runtime: RuntimePodStatus
    instances: Mapping[str, list[RuntimeContainer]]
    runtime_name: str
    sync_errors: Mapping[str, tuple[str, str]]
    readiness: Mapping[str, ProbeResult]
    startup: Mapping[str, ProbeResult]


def _instances_by_name(runtime: RuntimePodStatus) -> dict[str, list[RuntimeContainer]]:
    grouped: dict[str, list[RuntimeContainer]] = {}
    for instance in runtime.containers:
        grouped.setdefault(instance.name, []).append(instance)
    return grouped


def _runtime_state(
    ctx: _Context, instance: RuntimeContainer, old: ContainerStatus | None
) -> tuple[ContainerState, int]:
    """The API state of one instance, and its restart count."""
    container_id = status_container_id(ctx.runtime_name, instance.id)
    state = instance.state
    if state is RuntimeState.RUNNING:
        running = ContainerStateRunning(started_at=_time_or_none(instance.started_at))
        return ContainerState(running=running), instance.restart_count
    if state is RuntimeState.EXITED:
        terminated = ContainerStateTerminated(
            exit_code=instance.exit_code,
            reason=instance.reason or None,
            message=exit_message(ctx.pod, instance) or None,
            started_at=_time_or_none(instance.started_at),
            finished_at=_time_or_none(instance.finished_at),
            container_id=container_id,
        )
        return ContainerState(terminated=terminated), instance.restart_count
    if state is RuntimeState.UNKNOWN and old is not None and old.state.running is not None:
        # It was running and is now lost: report it as ended, not as never started,
        # so a run-once pod is not believed to be waiting to run again.
        lost = ContainerStateTerminated(
            exit_code=137,
            reason=STATUS_UNKNOWN_REASON,
            message="The container could not be located when the pod was terminated",
        )
        return ContainerState(terminated=lost), old.restart_count + 1
    # Created but not started, or unknown: waiting, with no reason (as Go).
    return ContainerState(waiting=ContainerStateWaiting()), instance.restart_count


def exit_message(pod: Pod, instance: RuntimeContainer) -> str:
    """The terminated state's message: the runtime's, then what the container left.

    Like the Go status manager, a pod's messages share 12 KiB between its init and
    regular containers: each keeps the start of its message, up to its share.
    """
    message = instance.message
    left = instance.termination_message
    if left:
        message = f"{message}: {left}" if message else left
    containers = len(pod.spec.containers) + len(pod.spec.init_containers)
    share = MAX_POD_TERMINATION_MESSAGE_BYTES // max(1, containers)
    raw = message.encode()
    if len(raw) <= share:
        return message
    return raw[:share].decode(errors="ignore")  # never half a character


def _status_from_instances(
    ctx: _Context,
    container: Container,
    instances: list[RuntimeContainer],
    old: ContainerStatus | None,
) -> ContainerStatus:
    newest = instances[0]
    state, restart_count = _runtime_state(ctx, newest, old)
    status = ContainerStatus(
        name=container.name,
        state=state,
        restart_count=restart_count,
        image=newest.image or container.image,
        image_id=newest.image_ref,
        container_id=status_container_id(ctx.runtime_name, newest.id),
    )
    if len(instances) > 1:
        status.last_state = _runtime_state(ctx, instances[1], None)[0]
    return status


def _status_without_instance(
    ctx: _Context, container: Container, old: ContainerStatus | None, waiting_reason: str
) -> ContainerStatus:
    default = ContainerState(waiting=ContainerStateWaiting(reason=waiting_reason))
    if old is not None and old.state.terminated is not None:
        return old.model_copy(deep=True)
    status = ContainerStatus(name=container.name, image=container.image, state=default)
    if old is None:
        return status
    status.restart_count = old.restart_count
    status.last_state = old.last_state.model_copy(deep=True)
    if old.state.running is not None and status.last_state.terminated is None:
        # The runtime lost a container that was running: it ended, we just do not know how.
        status.last_state = ContainerState(terminated=ContainerStateTerminated(
            exit_code=137,
            reason=STATUS_UNKNOWN_REASON,
            message="The container could not be located when the pod was deleted.  "
            "The container used to be Running",
        ))
        if ctx.pod.metadata.deletion_timestamp is None:
            status.restart_count += 1
    return status


def _apply_sync_error(
    ctx: _Context, container: Container, status: ContainerStatus, is_init: bool
) -> None:
    """A start that failed (CrashLoopBackOff, ErrImagePull, …) shows as the waiting reason."""
    error = ctx.sync_errors.get(container.name)
    if error is None:
        return
    instances = ctx.instances.get(container.name)
    newest = instances[0] if instances else None
    if is_init and newest is not None and newest.state is RuntimeState.EXITED \
            and newest.exit_code == 0:
        return  # a completed init container will not start again
    if not should_container_be_restarted(container, ctx.pod, ctx.runtime):
        return
    if status.state.terminated is not None:
        status.last_state = status.state
    reason, message = error
    status.state = ContainerState(waiting=ContainerStateWaiting(reason=reason, message=message))


def _set_started_and_ready(
    ctx: _Context, container: Container, status: ContainerStatus, regular_init: bool
) -> None:
    """``started``/``ready`` as the probe manager reports them (prober_manager.go)."""
    running = status.state.running is not None
    if regular_init:
        terminated = status.state.terminated
        status.started = running
        status.ready = terminated is not None and terminated.exit_code == 0
        return
    instances = ctx.instances.get(container.name)
    container_id = instances[0].id if instances else ""
    started = running and (
        container.startup_probe is None or ctx.startup.get(container_id) is ProbeResult.SUCCESS
    )
    status.started = started
    status.ready = started and (
        container.readiness_probe is None
        or ctx.readiness.get(container_id) is ProbeResult.SUCCESS
    )


def _container_statuses(
    ctx: _Context,
    containers: Sequence[Container],
    previous: Sequence[ContainerStatus],
    waiting_reason: str,
    kind: Literal["init", "regular", "ephemeral"],
) -> list[ContainerStatus]:
    """Statuses in spec order for one of the pod's three container lists."""
    old_by_name = {status.name: status for status in previous}
    statuses = []
    for container in containers:
        old = old_by_name.get(container.name)
        instances = ctx.instances.get(container.name)
        if instances:
            status = _status_from_instances(ctx, container, instances, old)
        else:
            status = _status_without_instance(ctx, container, old, waiting_reason)
        _apply_sync_error(ctx, container, status, kind == "init")
        if kind != "ephemeral":
            regular_init = kind == "init" and not is_sidecar(container)
            _set_started_and_ready(ctx, container, status, regular_init)
        statuses.append(status)
    return statuses


# -- conditions ------------------------------------------------------------------------


def _names(names: Sequence[str]) -> str:
    return "[" + " ".join(names) + "]"


def _containers_condition(
    kind: str, reason: str, unknown: Sequence[str], failing: tuple[str, Sequence[str]]
) -> PodCondition:
    """True when no container is unknown or failing the check; else False with Go's message
    (``containers with unknown status: [a], containers with <what> status: [b]``)."""
    what, names = failing
    messages = []
    if unknown:
        messages.append(f"containers with unknown status: {_names(unknown)}")
    if names:
        messages.append(f"containers with {what} status: {_names(names)}")
    if messages:
        return PodCondition(type=kind, status="False", reason=reason, message=", ".join(messages))
    return PodCondition(type=kind, status="True")


def _initialized_condition(
    pod: Pod, statuses: Mapping[str, ContainerStatus], phase: PodPhase
) -> PodCondition:
    if not pod.spec.init_containers:
        return PodCondition(type="Initialized", status="True")
    unknown: list[str] = []
    incomplete: list[str] = []
    for container in pod.spec.init_containers:
        status = statuses.get(container.name)
        if status is None:
            unknown.append(container.name)
        elif not (status.started if is_sidecar(container) else status.ready):
            incomplete.append(container.name)
    if phase == "Succeeded" and not unknown:
        return PodCondition(type="Initialized", status="True", reason="PodCompleted")
    if has_any_regular_container_started(pod, statuses):
        return PodCondition(type="Initialized", status="True")
    return _containers_condition(
        "Initialized", "ContainersNotInitialized", unknown, ("incomplete", incomplete)
    )


def _containers_ready_condition(
    pod: Pod, statuses: Mapping[str, ContainerStatus], phase: PodPhase
) -> PodCondition:
    unknown: list[str] = []
    unready: list[str] = []
    must_be_ready = [c for c in pod.spec.init_containers if is_sidecar(c)]
    for container in (*must_be_ready, *pod.spec.containers):
        status = statuses.get(container.name)
        if status is None:
            unknown.append(container.name)
        elif not status.ready:
            unready.append(container.name)
    if phase == "Succeeded" and not unknown:
        return PodCondition(type="ContainersReady", status="False", reason="PodCompleted")
    return _containers_condition(
        "ContainersReady", "ContainersNotReady", unknown, ("unready", unready)
    )


def _ready_condition(
    pod: Pod, containers_ready: PodCondition, conditions: Sequence[PodCondition]
) -> PodCondition:
    """``GeneratePodReadyCondition``: Ready when the containers are ready and every
    readiness gate's condition (looked up in ``conditions``) is True.

    Until the containers are ready, Ready repeats ContainersReady's status, reason and
    message; the gates speak only after that.
    """
    if containers_ready.status != "True":
        return PodCondition(type="Ready", status=containers_ready.status,
                            reason=containers_ready.reason, message=containers_ready.message)
    by_type = {condition.type: condition for condition in conditions}
    unready = []
    for gate in pod.spec.readiness_gates:
        found = by_type.get(gate.condition_type)
        if found is None:
            unready.append(f'corresponding condition of pod readiness gate '
                           f'"{gate.condition_type}" does not exist.')
        elif found.status != "True":
            unready.append(f'the status of pod readiness gate "{gate.condition_type}" '
                           f'is not "True", but {found.status}')
    if unready:
        return PodCondition(type="Ready", status="False", reason=READINESS_GATES_NOT_READY,
                            message=", ".join(unready))
    return PodCondition(type="Ready", status="True")


def _with_transition_times(
    conditions: list[PodCondition], old: Sequence[PodCondition], now: float
) -> list[PodCondition]:
    old_by_type = {c.type: c for c in old}
    stamp = format_time(now)
    for condition in conditions:
        before = old_by_type.get(condition.type)
        if before is not None and before.status == condition.status \
                and before.last_transition_time:
            condition.last_transition_time = before.last_transition_time
        else:
            condition.last_transition_time = stamp
    return conditions


def _conditions(
    pod: Pod,
    runtime: RuntimePodStatus,
    statuses: Mapping[str, ContainerStatus],
    phase: PodPhase,
    old: PodStatus,
    now: float,
) -> list[PodCondition]:
    kept = [c for c in pod.status.conditions if c.type not in KUBELET_CONDITIONS]
    sandbox = pod_sandbox_changed(pod, runtime)
    ready_to_start = PodCondition(
        type="PodReadyToStartContainers",
        status="False" if sandbox.create else "True",
        message=sandbox.reason or None,
    )
    initialized = _initialized_condition(pod, statuses, phase)
    containers_ready = _containers_ready_condition(pod, statuses, phase)
    # The gates are read from the conditions so far, as Go's generateAPIPodStatus does:
    # the pod's own (a controller's, the readiness gates') and the two computed above.
    ready = _ready_condition(pod, containers_ready, [*kept, ready_to_start, initialized])
    owned = [
        ready_to_start,
        initialized,
        ready,
        containers_ready,
        PodCondition(type="PodScheduled", status="True"),
    ]
    return kept + _with_transition_times(owned, old.conditions, now)


# -- pod status ------------------------------------------------------------------------


def _pod_ips(pod: Pod, runtime: RuntimePodStatus, old: PodStatus, host_ip: str) -> list[str]:
    if pod.spec.host_network and host_ip:
        return [host_ip]
    sandboxes = runtime.sandboxes
    if sandboxes and sandboxes[0].state is SandboxState.READY and sandboxes[0].ip:
        return sandboxes[0].ips
    # No live sandbox reports an address (it died or the pod finished): keep showing
    # the last one rather than blanking it.
    return [ip.ip for ip in old.pod_ips] or ([old.pod_ip] if old.pod_ip else [])


def _sticky_phase(pod: Pod, phase: PodPhase, old: PodStatus) -> PodPhase:
    """A terminal phase is final: the API server's wins, then the one we reported before.

    Go lets a reported Succeeded turn into Failed when only the status manager (not
    the API server) has seen it; here any terminal phase, once reported, stays.
    """
    if pod.status.phase in TERMINAL_PHASES:
        return pod.status.phase
    if old.phase in TERMINAL_PHASES:
        return old.phase
    return phase


def _qos_class(pod: Pod) -> str | None:
    try:
        return pod_qos_class(pod)
    except QuantityError:
        return None  # a malformed quantity is reported where the spec is validated


def compute_pod_status(
    pod: Pod,
    runtime: RuntimePodStatus,
    *,
    now: float,
    previous: PodStatus | None = None,
    sync_errors: Mapping[str, tuple[str, str]] = _NO_ERRORS,
    readiness: Mapping[str, ProbeResult] = _NO_RESULTS,
    startup: Mapping[str, ProbeResult] = _NO_RESULTS,
    host_ip: str = "",
    runtime_name: str = "containerd",
    pod_is_terminal: bool = False,
) -> PodStatus:
    """The API status of ``pod`` from the runtime's view of it, at time ``now``.

    ``previous`` is the status last computed (defaults to the pod's API status);
    ``sync_errors`` maps a container name to the (reason, message) of its last failed
    start; ``readiness``/``startup`` map runtime container IDs to probe results;
    ``pod_is_terminal`` is the pod worker's verdict that nothing will run again.
    """
    old = previous if previous is not None else pod.status
    ctx = _Context(pod, runtime, _instances_by_name(runtime), runtime_name,
                   sync_errors, readiness, startup)
    spec = pod.spec
    # Go's default for a container the runtime does not have (yet), of any kind: a pod
    # with init containers shows PodInitializing, whether its init containers are done
    # or not (convertToAPIContainerStatuses' hasInitContainers).
    waiting = POD_INITIALIZING if spec.init_containers else CONTAINER_CREATING
    init_statuses = _container_statuses(
        ctx, spec.init_containers, old.init_container_statuses, waiting, "init")
    regular_statuses = _container_statuses(
        ctx, spec.containers, old.container_statuses, waiting, "regular")
    ephemeral_statuses = _container_statuses(
        ctx, spec.ephemeral_containers, old.ephemeral_container_statuses, waiting, "ephemeral")
    all_statuses = [*init_statuses, *regular_statuses]
    phase = get_phase(pod, all_statuses, pod_is_terminal=pod_is_terminal)
    phase = _sticky_phase(pod, phase, old)
    by_name = {status.name: status for status in all_statuses}
    ips = _pod_ips(pod, runtime, old, host_ip)
    same_phase = phase == old.phase
    return PodStatus(
        phase=phase,
        conditions=_conditions(pod, runtime, by_name, phase, old, now),
        reason=(old.reason or pod.status.reason) if same_phase else None,
        message=(old.message or pod.status.message) if same_phase else None,
        host_ip=host_ip or old.host_ip,
        pod_ip=ips[0] if ips else None,
        pod_ips=[PodIP(ip=ip) for ip in ips],
        start_time=old.start_time or format_time(now),
        qos_class=_qos_class(pod),
        init_container_statuses=init_statuses,
        container_statuses=regular_statuses,
        ephemeral_container_statuses=ephemeral_statuses,
    )

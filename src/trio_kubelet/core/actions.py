"""compute_pod_actions: what to kill and start so the runtime matches the pod spec.

The Go kubelet's ``computePodActions`` (kuberuntime_manager.go), with
``computeInitContainerActions`` (kuberuntime_container.go), ``PodSandboxChanged``
(kuberuntime/util) and ``ShouldContainerBeRestarted`` (container/helpers.go), as pure
functions of the pod, the runtime's view of it and the probe results.

Feature gates are as in the Go defaults: ContainerRestartRules,
RestartAllContainersOnContainerExits and in-place resize are off, so there are no
per-container restart rules, no "restart all containers" and no resize actions.

Deliberate differences from Go, all because our static pods keep their UID across
manifest edits (Go never sees a spec change under a live UID):
* running instances whose name is in no container list, and running older
  instances of a name, are killed (Go ignores them);
* the container hash covers the whole spec (see ``core.hashing``);
* a pod being deleted never gets a new sandbox or any container start.
Sidecars (init containers with ``restartPolicy: Always``) follow their own policy
when deciding whether an exited instance would restart, as under ContainerRestartRules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    SandboxState,
)
from trio_kubelet.model.pod import Container, Pod

REASON_LIVENESS_PROBE = "LivenessProbe"
REASON_STARTUP_PROBE = "StartupProbe"
REASON_UNKNOWN = "Unknown"

_RUNNING = ContainerState.RUNNING
_EXITED = ContainerState.EXITED
_UNKNOWN = ContainerState.UNKNOWN
_CREATED = ContainerState.CREATED
_FAILURE = ProbeResult.FAILURE
_SUCCESS = ProbeResult.SUCCESS
_NO_RESULTS: Mapping[str, ProbeResult] = {}


@dataclass(frozen=True, slots=True)
class ContainerToKill:
    """A running (or unknown) container instance to stop, and why."""

    name: str
    reason: str
    message: str


@dataclass(slots=True)
class PodActions:
    """The decision for one sync of one pod.

    Indexes refer to positions in ``spec.init_containers``, ``spec.containers`` and
    ``spec.ephemeral_containers``; ``containers_to_kill`` is keyed by runtime container ID.
    ``reasons`` says, in words, which rule produced each decision (for ``explain``
    and the replay trace); it is empty when there is nothing to do. ``kill_pod_reason``
    is why the pod is killed (also in ``reasons``), for the worker's log.
    """

    kill_pod: bool = False
    create_sandbox: bool = False
    sandbox_id: str = ""
    attempt: int = 0
    init_containers_to_start: list[int] = field(default_factory=list)
    containers_to_start: list[int] = field(default_factory=list)
    containers_to_kill: dict[str, ContainerToKill] = field(default_factory=dict)
    ephemeral_containers_to_start: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    kill_pod_reason: str = ""

    def kill_pod_because(self, why: str) -> None:
        """Kill the pod, saying why (``reasons`` gets ``kill pod: <why>``)."""
        self.kill_pod = True
        self.kill_pod_reason = why
        self.reasons.append(f"kill pod: {why}")


@dataclass(frozen=True, slots=True)
class SandboxChange:
    """Whether the pod needs a new sandbox, with which attempt number, and why."""

    create: bool
    attempt: int
    sandbox_id: str
    reason: str = ""


def pod_sandbox_changed(pod: Pod, status: RuntimePodStatus) -> SandboxChange:
    """``PodSandboxChanged``: a new sandbox is needed unless exactly the newest one is usable."""
    sandboxes = status.sandboxes
    if not sandboxes:
        return SandboxChange(True, 0, "", "no sandbox exists")
    newest = sandboxes[0]
    attempt = max(s.attempt for s in sandboxes)
    ready = sum(1 for s in sandboxes if s.state is SandboxState.READY)
    if ready > 1:
        return SandboxChange(True, attempt + 1, newest.id, f"{ready} sandboxes are ready")
    if newest.state is not SandboxState.READY:
        return SandboxChange(True, attempt + 1, newest.id, "the newest sandbox is not ready")
    host_network = pod.spec.host_network
    if newest.host_network != host_network:
        # The old sandbox's network namespace cannot be reused, so no sandbox ID is passed on.
        return SandboxChange(True, attempt + 1, "", "the sandbox network mode changed")
    if not host_network and not newest.ip:
        return SandboxChange(True, attempt + 1, newest.id, "the sandbox has no IP address")
    return SandboxChange(False, attempt, newest.id)


def is_pod_deleting(pod: Pod) -> bool:
    """The API server set a deletion timestamp: nothing of this pod may (re)start."""
    return pod.metadata.deletion_timestamp is not None


def should_container_be_restarted(container: Container, pod: Pod, status: RuntimePodStatus) -> bool:
    """``ShouldContainerBeRestarted``: whether a container that is not running should start."""
    return _should_restart(container, pod, status.find(container.name))


def _should_restart(container: Container, pod: Pod, instance: RuntimeContainer | None) -> bool:
    if pod.metadata.deletion_timestamp is not None:
        return False
    if instance is None:
        return True
    state = instance.state
    if state is _RUNNING:
        return False
    if state is _UNKNOWN or state is _CREATED:
        return True  # it may never have run, whatever the policy
    policy = container.restart_policy or pod.spec.restart_policy
    if policy == "Never":
        return False
    if policy == "OnFailure":
        return instance.exit_code != 0
    return True


def is_init_container_failed(instance: RuntimeContainer) -> bool:
    """``isInitContainerFailed``: OOM-killed, exited non-zero, or lost track of."""
    if instance.state is _EXITED:
        return instance.exit_code != 0 or instance.reason == "OOMKilled"
    return instance.state is _UNKNOWN or instance.reason == "OOMKilled"


def compute_pod_actions(
    pod: Pod,
    status: RuntimePodStatus,
    *,
    liveness: Mapping[str, ProbeResult] | None = None,
    startup: Mapping[str, ProbeResult] | None = None,
) -> PodActions:
    """What one sync of ``pod`` must do, given the runtime status and probe results.

    ``liveness`` and ``startup`` map runtime container IDs to published probe
    results; a missing ID means the probe has not reported yet.
    """
    change = pod_sandbox_changed(pod, status)
    actions = PodActions(
        kill_pod=change.create,
        create_sandbox=change.create,
        sandbox_id=change.sandbox_id,
        attempt=change.attempt,
    )
    if is_pod_deleting(pod):
        # Go leaves computePodActions for SyncTerminatingPod here: stop everything
        # (with the deletion's grace period), start nothing, make no sandbox.
        actions.create_sandbox = False
        actions.kill_pod_because("the pod is being deleted")
        return actions
    latest = _newest_instances(status)
    if change.create:
        _plan_new_sandbox(pod, status, latest, change, actions)
        return actions
    liveness = liveness or _NO_RESULTS
    startup = startup or _NO_RESULTS
    _kill_strays(pod, status, latest, actions)
    _start_ephemeral_containers(pod, latest, actions)
    initialized = _compute_init_container_actions(pod, latest, liveness, startup, actions)
    if actions.kill_pod or not initialized:
        return actions
    kept = _compute_regular_container_actions(pod, latest, liveness, startup, actions)
    if kept == 0 and not actions.containers_to_start:
        # Sidecars must not keep a pod alive once its regular containers are done.
        actions.init_containers_to_start = []
        actions.kill_pod_because("no regular container is running or will start")
    return actions


def _newest_instances(status: RuntimePodStatus) -> dict[str, RuntimeContainer]:
    latest: dict[str, RuntimeContainer] = {}
    for instance in status.containers:
        if instance.name not in latest:
            latest[instance.name] = instance
    return latest


def _plan_new_sandbox(
    pod: Pod,
    status: RuntimePodStatus,
    latest: Mapping[str, RuntimeContainer],
    change: SandboxChange,
    actions: PodActions,
) -> None:
    """A new sandbox means everything restarts: pick what runs first in it, if anything."""
    spec = pod.spec
    if spec.restart_policy == "Never" and change.attempt != 0 and status.containers:
        actions.create_sandbox = False
        actions.kill_pod_because(f"{change.reason}; policy Never and containers already ran")
        return
    run_once = spec.restart_policy == "OnFailure"
    candidates = [
        index
        for index, container in enumerate(spec.containers)
        if not (run_once and _succeeded(latest.get(container.name)))
    ]
    if not candidates and any(c.name in latest for c in spec.containers):
        actions.create_sandbox = False
        actions.kill_pod_because(f"{change.reason}; every container succeeded")
        return
    actions.kill_pod_reason = change.reason
    actions.reasons.append(
        f"kill pod and create sandbox (attempt {change.attempt}): {change.reason}"
    )
    if spec.init_containers:
        actions.init_containers_to_start = [0]
        actions.reasons.append(f"start init container {spec.init_containers[0].name}: new sandbox")
        return
    actions.containers_to_start = candidates
    for index in candidates:
        actions.reasons.append(f"start {spec.containers[index].name}: new sandbox")


def _succeeded(instance: RuntimeContainer | None) -> bool:
    return instance is not None and instance.state is _EXITED and instance.exit_code == 0


def _kill(actions: PodActions, instance: RuntimeContainer, reason: str, message: str) -> None:
    actions.containers_to_kill[instance.id] = ContainerToKill(instance.name, reason, message)
    actions.reasons.append(f"kill {instance.name} ({instance.id}): {message}")


def _kill_strays(
    pod: Pod,
    status: RuntimePodStatus,
    latest: Mapping[str, RuntimeContainer],
    actions: PodActions,
) -> None:
    """Stop live instances no spec entry accounts for (see the module docstring)."""
    spec = pod.spec
    names: set[str] | None = None
    for instance in status.containers:
        if instance.state is not _RUNNING and instance.state is not _UNKNOWN:
            continue
        if latest[instance.name] is not instance:
            _kill(actions, instance, "", f"Container {instance.name} has a newer instance")
            continue
        if names is None:
            names = {c.name for c in (*spec.init_containers, *spec.containers)}
            names.update(c.name for c in spec.ephemeral_containers)
        if instance.name not in names:
            _kill(actions, instance, "", f"Container {instance.name} is not in the pod spec")


def _start_ephemeral_containers(
    pod: Pod, latest: Mapping[str, RuntimeContainer], actions: PodActions
) -> None:
    """Ephemeral containers run once: start those that never had an instance."""
    for index, container in enumerate(pod.spec.ephemeral_containers):
        if container.name not in latest:
            actions.ephemeral_containers_to_start.append(index)
            actions.reasons.append(f"start ephemeral container {container.name}: never started")


def _compute_init_container_actions(
    pod: Pod,
    latest: Mapping[str, RuntimeContainer],
    liveness: Mapping[str, ProbeResult],
    startup: Mapping[str, ProbeResult],
    actions: PodActions,
) -> bool:
    """``computeInitContainerActions``: progress initialization and keep sidecars alive.

    Returns whether the pod is initialized. The walk goes from the last init
    container to the first, because completed init containers may have been
    removed from the runtime and only the furthest one reached tells the truth.
    """
    init_containers = pod.spec.init_containers
    if not init_containers:
        return True
    # A Created or Running regular container proves initialization finished at some
    # point; an Exited one does not (after a node reboot everything is Exited).
    initialized = any(
        (instance := latest.get(c.name)) is not None
        and (instance.state is _RUNNING or instance.state is _CREATED)
        for c in pod.spec.containers
    )
    walk = _InitWalk(pod, liveness, startup, actions, initialized)
    last = len(init_containers) - 1
    for index in range(last, -1, -1):
        container = init_containers[index]
        instance = latest.get(container.name)
        if not walk.step(index, index == last, container, instance):
            return False
    if not walk.previous_initialized:
        walk.start(0, init_containers[0].name, "no init container has run yet")
    walk.starts.reverse()
    actions.init_containers_to_start.extend(walk.starts)
    return walk.initialized


class _InitWalk:
    """The state of one last-to-first walk over the init containers."""

    __slots__ = ("actions", "initialized", "liveness", "pod", "previous_initialized", "starts",
                 "startup")

    def __init__(
        self,
        pod: Pod,
        liveness: Mapping[str, ProbeResult],
        startup: Mapping[str, ProbeResult],
        actions: PodActions,
        initialized: bool,
    ) -> None:
        self.pod = pod
        self.liveness = liveness
        self.startup = startup
        self.actions = actions
        self.initialized = initialized
        # Whether some init container after the current one has already run.
        self.previous_initialized = initialized
        self.starts: list[int] = []

    def start(self, index: int, name: str, why: str) -> None:
        self.starts.append(index)
        self.actions.reasons.append(f"start init container {name}: {why}")

    def kill_pod(self, name: str, why: str) -> bool:
        self.actions.init_containers_to_start = []
        self.starts = []
        self.actions.kill_pod_because(f"init container {name} {why}; policy Never")
        return False

    def step(
        self, index: int, is_last: bool, container: Container, instance: RuntimeContainer | None
    ) -> bool:
        """Handle one init container; False means the pod is to be killed."""
        sidecar = container.restart_policy == "Always"
        if instance is None:
            if self.previous_initialized and sidecar:
                self.start(index, container.name, "sidecar has no instance")
            return True
        if self.previous_initialized and not sidecar:
            return True  # after initialization only sidecars need to keep running
        state = instance.state
        if state is _CREATED:
            self.start(index, container.name, "created but never started")
        elif state is _RUNNING:
            if sidecar:
                self._running_sidecar(index, is_last, container, instance)
        elif state is _EXITED:
            if not self._exited(index, is_last, container, instance, sidecar):
                return False
        elif not self._unknown(index, container, instance, sidecar):
            return False
        self.previous_initialized = True
        return True

    def _running_sidecar(
        self, index: int, is_last: bool, container: Container, instance: RuntimeContainer
    ) -> None:
        name = container.name
        if container.startup_probe is not None:
            result = self.startup.get(instance.id)
            if result is None:
                return  # wait for the startup probe before starting the next one
            if result is not _SUCCESS:
                if result is _FAILURE:
                    _kill(self.actions, instance, REASON_STARTUP_PROBE,
                          f"Init container {name} failed startup probe")
                    self.start(index, name, "failed startup probe")
                return
        if is_last:
            self.initialized = True
        elif not self.previous_initialized:
            self.start(index + 1, self.pod.spec.init_containers[index + 1].name,
                       f"sidecar {name} has started")
        if instance.spec_hash != container_hash(container):
            _kill(self.actions, instance, "", f"Init container {name} definition changed")
            self.start(index, name, "definition changed")
            return
        if container.liveness_probe is not None and self.liveness.get(instance.id) is _FAILURE:
            _kill(self.actions, instance, REASON_LIVENESS_PROBE,
                  f"Init container {name} failed liveness probe")
            self.start(index, name, "failed liveness probe")

    def _exited(
        self,
        index: int,
        is_last: bool,
        container: Container,
        instance: RuntimeContainer,
        sidecar: bool,
    ) -> bool:
        name = container.name
        if sidecar:
            self.start(index, name, f"sidecar exited {instance.exit_code}")
            return True
        if is_init_container_failed(instance):
            if self.pod.spec.restart_policy == "Never":
                return self.kill_pod(name, f"failed (exit {instance.exit_code})")
            self.start(index, name, f"failed (exit {instance.exit_code}), "
                                    f"policy {self.pod.spec.restart_policy}")
            return True
        if is_last:
            self.initialized = True
        else:
            self.start(index + 1, self.pod.spec.init_containers[index + 1].name,
                       f"init container {name} succeeded")
        return True

    def _unknown(
        self, index: int, container: Container, instance: RuntimeContainer, sidecar: bool
    ) -> bool:
        name = container.name
        if not sidecar and self.pod.spec.restart_policy == "Never":
            return self.kill_pod(name, "is in an unknown state")
        _kill(self.actions, instance, REASON_UNKNOWN,
              'Init container is in "unknown" state, try killing it before restart')
        self.start(index, name, "unknown state")
        return True


def _compute_regular_container_actions(
    pod: Pod,
    latest: Mapping[str, RuntimeContainer],
    liveness: Mapping[str, ProbeResult],
    startup: Mapping[str, ProbeResult],
    actions: PodActions,
) -> int:
    """Start, restart or kill the regular containers; returns how many keep running."""
    kept = 0
    for index, container in enumerate(pod.spec.containers):
        instance = latest.get(container.name)
        if instance is None or instance.state is not _RUNNING:
            if _should_restart(container, pod, instance):
                actions.containers_to_start.append(index)
                actions.reasons.append(f"start {container.name}: {_why_start(pod, instance)}")
                if instance is not None and instance.state is _UNKNOWN:
                    # It may still be running: never risk two live instances.
                    _kill(actions, instance, REASON_UNKNOWN,
                          'Container is in "unknown" state, try killing it before restart')
            continue
        if not _kill_running(pod, index, container, instance, liveness, startup, actions):
            kept += 1
    return kept


def _kill_running(
    pod: Pod,
    index: int,
    container: Container,
    instance: RuntimeContainer,
    liveness: Mapping[str, ProbeResult],
    startup: Mapping[str, ProbeResult],
    actions: PodActions,
) -> bool:
    """Kill a running regular container that is stale or unhealthy; False keeps it."""
    name = container.name
    restart = pod.spec.restart_policy != "Never"
    if instance.spec_hash != container_hash(container):
        reason, message = "", f"Container {name} definition changed"
        restart = True  # a changed spec is applied whatever the restart policy
    elif liveness.get(instance.id) is _FAILURE:
        reason, message = REASON_LIVENESS_PROBE, f"Container {name} failed liveness probe"
    elif startup.get(instance.id) is _FAILURE:
        reason, message = REASON_STARTUP_PROBE, f"Container {name} failed startup probe"
    else:
        return False
    if restart:
        message += ", will be restarted"
        actions.containers_to_start.append(index)
    _kill(actions, instance, reason, message)
    return True


def _why_start(pod: Pod, instance: RuntimeContainer | None) -> str:
    if instance is None:
        return "no instance"
    if instance.state is _EXITED:
        return f"exited {instance.exit_code}, policy {pod.spec.restart_policy}"
    if instance.state is _CREATED:
        return "created but never started"
    return "state unknown"

"""Invariants of compute_pod_actions over generated pods and runtime states."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simulate import Simulator, is_noop
from strategies import pods, pods_with_state, regular_init_containers, runtime_statuses

from trio_kubelet.core.actions import compute_pod_actions
from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.model.pod import Pod, is_sidecar

RUNNING = ContainerState.RUNNING
EXITED = ContainerState.EXITED
PROPERTY_SETTINGS = settings(max_examples=300, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


def sync_budget(pod: Pod) -> int:
    """Enough syncs for any path: a sandbox, each init container in turn, then the rest."""
    return 2 * len(pod.spec.init_containers) + 8


def converge(sim: Simulator) -> int:
    """Sync until nothing is left to do; returns the number of syncs it took."""
    for step in range(sync_budget(sim.pod)):
        before = sim.status
        if is_noop(sim.sync()) and sim.status == before:
            return step
    raise AssertionError(f"no fixed point after {sync_budget(sim.pod)} syncs: {sim.status}")


def assert_everything_runs(sim: Simulator) -> None:
    pod, status = sim.pod, sim.status
    assert status.sandboxes[0].state.value == "ready"
    for container in [*pod.spec.containers, *(c for c in pod.spec.init_containers
                                               if is_sidecar(c))]:
        newest = status.find(container.name)
        assert newest is not None and newest.state is RUNNING, container.name
        assert newest.spec_hash == container_hash(container), container.name
    for container in regular_init_containers(pod):
        newest = status.find(container.name)
        assert newest is not None and (newest.state, newest.exit_code) == (EXITED, 0)
    for container in pod.spec.ephemeral_containers:
        assert status.find(container.name) is not None


@PROPERTY_SETTINGS
@given(pods())
def test_new_pod_converges_to_everything_running(pod: Pod) -> None:
    sim = Simulator(pod, RuntimePodStatus(uid="uid-1"))
    converge(sim)
    assert_everything_runs(sim)


@PROPERTY_SETTINGS
@given(st.data(), pods(policies=["Always"]))
def test_always_pod_converges_from_any_state(data: st.DataObject, pod: Pod) -> None:
    sim = Simulator(pod, data.draw(runtime_statuses(pod)))
    converge(sim)
    assert_everything_runs(sim)
    assert is_noop(sim.sync())


@PROPERTY_SETTINGS
@given(st.data(), pods(deleting=None))
def test_any_pod_reaches_a_state_sync_leaves_alone(data: st.DataObject, pod: Pod) -> None:
    sim = Simulator(pod, data.draw(runtime_statuses(pod)))
    for _ in range(sync_budget(pod)):
        before = sim.status
        sim.sync()
        if sim.status == before:
            return
    raise AssertionError(f"still changing after {sync_budget(pod)} syncs: {sim.status}")


@PROPERTY_SETTINGS
@given(pods_with_state(policies=["Never"]))
def test_never_policy_never_restarts_an_exited_container(
    case: tuple[Pod, RuntimePodStatus, dict[str, ProbeResult], dict[str, ProbeResult]],
) -> None:
    pod, status, liveness, startup = case
    actions = compute_pod_actions(pod, status, liveness=liveness, startup=startup)
    for index in actions.containers_to_start:
        newest = status.find(pod.spec.containers[index].name)
        assert newest is None or newest.state is not EXITED
    for index in actions.init_containers_to_start:
        container = pod.spec.init_containers[index]
        newest = status.find(container.name)
        if not is_sidecar(container) and newest is not None and newest.state is EXITED:
            assert newest.exit_code == 0 and newest.reason != "OOMKilled"


def _sidecar_awaiting_startup(pod: Pod, instance: RuntimeContainer,
                              startup: dict[str, ProbeResult]) -> bool:
    return any(is_sidecar(c) and c.name == instance.name and c.startup_probe is not None
               and startup.get(instance.id) is not ProbeResult.SUCCESS
               for c in pod.spec.init_containers)


@PROPERTY_SETTINGS
@given(pods_with_state(deleting=None))
def test_kills_and_keeps_are_consistent(
    case: tuple[Pod, RuntimePodStatus, dict[str, ProbeResult], dict[str, ProbeResult]],
) -> None:
    pod, status, liveness, startup = case
    actions = compute_pod_actions(pod, status, liveness=liveness, startup=startup)
    by_id = {c.id: c for c in status.containers}
    for container_id, kill in actions.containers_to_kill.items():
        assert by_id[container_id].state in (RUNNING, ContainerState.UNKNOWN)
        assert by_id[container_id].name == kill.name
    if actions.kill_pod:
        return
    specs = {c.name: c for c in [*pod.spec.init_containers, *pod.spec.containers,
                                 *pod.spec.ephemeral_containers]}
    for instance in status.containers:
        if instance.state is not RUNNING or instance.id in actions.containers_to_kill:
            continue
        assert status.find(instance.name) is instance, "an older duplicate was kept"
        spec = specs.get(instance.name)
        assert spec is not None, "a container outside the spec was kept"
        exempt = (spec in pod.spec.ephemeral_containers
                  or (spec in pod.spec.init_containers and not is_sidecar(spec))
                  or _sidecar_awaiting_startup(pod, instance, startup))
        assert exempt or instance.spec_hash == container_hash(spec), instance.name


@PROPERTY_SETTINGS
@given(pods_with_state(deleting=None))
def test_init_containers_start_in_spec_order(
    case: tuple[Pod, RuntimePodStatus, dict[str, ProbeResult], dict[str, ProbeResult]],
) -> None:
    pod, status, liveness, startup = case
    starts = compute_pod_actions(pod, status, liveness=liveness,
                                 startup=startup).init_containers_to_start
    assert starts == sorted(set(starts))
    regular = [i for i in starts if not is_sidecar(pod.spec.init_containers[i])]
    assert len(regular) <= 1, "at most one regular init container runs at a time"


def _finished(pod: Pod, status: RuntimePodStatus, exit_code: int) -> RuntimePodStatus:
    """Every regular container's newest instance exited; every sidecar is up and healthy."""
    containers = []
    for instance in status.containers:
        spec = next((c for c in pod.spec.containers if c.name == instance.name), None)
        if spec is not None and status.find(instance.name) is instance:
            instance = replace(instance, state=EXITED, exit_code=exit_code)
        containers.append(instance)
    for index, container in enumerate(pod.spec.containers):
        if status.find(container.name) is None:
            containers.append(RuntimeContainer(id=f"done{index}", name=container.name,
                                               state=EXITED, exit_code=exit_code))
    for index, container in enumerate(pod.spec.init_containers):
        if is_sidecar(container):
            containers.insert(0, RuntimeContainer(
                id=f"side{index}", name=container.name, state=RUNNING,
                spec_hash=container_hash(container), created_at=1e6))
        else:
            containers.insert(0, RuntimeContainer(
                id=f"init{index}", name=container.name, state=EXITED, exit_code=0))
    sandboxes = status.sandboxes or (RuntimeSandbox(
        id="sandbox", state=SandboxState.READY, ip="10.0.0.9", host_network=pod.spec.host_network),)
    return replace(status, sandboxes=sandboxes, containers=tuple(containers))


@PROPERTY_SETTINGS
@given(st.data(), pods(policies=["OnFailure", "Never"], deleting=None))
def test_succeeded_pod_is_killed_not_recreated(data: st.DataObject, pod: Pod) -> None:
    status = _finished(pod, data.draw(runtime_statuses(pod, orphans=False)), exit_code=0)
    sidecars_up = {c.id: ProbeResult.SUCCESS for c in status.containers
                   if c.id.startswith("side")}
    actions = compute_pod_actions(pod, status, liveness=sidecars_up, startup=sidecars_up)
    assert actions.kill_pod and not actions.create_sandbox
    assert not actions.containers_to_start and not actions.init_containers_to_start


@PROPERTY_SETTINGS
@given(st.data(), pods(policies=["Never"], deleting=None))
def test_sidecars_never_keep_a_finished_pod_alive(data: st.DataObject, pod: Pod) -> None:
    status = _finished(pod, data.draw(runtime_statuses(pod, orphans=False)),
                       exit_code=data.draw(st.sampled_from([0, 1])))
    sim = Simulator(pod, status)
    for _ in range(sync_budget(pod)):
        actions = sim.sync()
        assert not actions.containers_to_start
        if actions.kill_pod:
            assert not actions.init_containers_to_start
            break
    else:
        raise AssertionError("the finished pod was never killed")
    assert all(c.state is not RUNNING for c in sim.status.containers)


@PROPERTY_SETTINGS
@given(pods(policies=["Always"]), st.integers(1, 6))
def test_crash_looping_container_is_restarted_with_increasing_count(
    pod: Pod, crashes: int
) -> None:
    sim = Simulator(pod, RuntimePodStatus(uid="uid-1"))
    converge(sim)
    name = pod.spec.containers[0].name
    for _ in range(crashes):
        sim.exit(name, 1)
        assert sim.sync().containers_to_start == [0]
    newest = sim.status.find(name)
    assert newest is not None and newest.restart_count == crashes

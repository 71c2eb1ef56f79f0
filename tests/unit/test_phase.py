"""getPhase and compute_pod_status: the pod status the kubelet reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from trio_kubelet.core.observed import (
    ContainerState as RuntimeState,
)
from trio_kubelet.core.observed import (
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.core.phase import compute_pod_status, get_phase
from trio_kubelet.core.timestamps import format_time
from trio_kubelet.model.pod import (
    ContainerState,
    ContainerStateRunning,
    ContainerStateTerminated,
    ContainerStateWaiting,
    ContainerStatus,
    Pod,
    PodCondition,
    PodIP,
    PodStatus,
)

NOW = 1795341600.0  # 2026-11-22T10:00:00Z
PROBE = {"exec": {"command": ["true"]}}


def make_pod(
    containers: Sequence[str | dict[str, Any]] = ("app",),
    init: Sequence[str | dict[str, Any]] = (),
    policy: str = "Always",
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> Pod:
    def expand(item: str | dict[str, Any]) -> dict[str, Any]:
        return {"name": item, "image": "busybox:1.36"} if isinstance(item, str) \
            else {"image": "busybox:1.36", **item}
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default", "uid": "u-1",
                     "annotations": annotations or {}},
        "spec": {"containers": [expand(c) for c in containers],
                 "initContainers": [expand(c) for c in init],
                 "restartPolicy": policy, **spec},
    })


def sidecar(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "restartPolicy": "Always", **extra}


# -- getPhase ------------------------------------------------------------------------------


def running(name: str, started: bool = True) -> ContainerStatus:
    return ContainerStatus(name=name, started=started,
                           state=ContainerState(running=ContainerStateRunning()))


def terminated(name: str, code: int) -> ContainerStatus:
    return ContainerStatus(
        name=name, state=ContainerState(terminated=ContainerStateTerminated(exit_code=code)))


def waiting(name: str, last_exit: int | None = None) -> ContainerStatus:
    last = ContainerState()
    if last_exit is not None:
        last = ContainerState(terminated=ContainerStateTerminated(exit_code=last_exit))
    return ContainerStatus(name=name, state=ContainerState(waiting=ContainerStateWaiting()),
                           last_state=last)


TWO = ("a", "b")
STATIC = {"kubernetes.io/config.source": "file"}

PHASE_CASES = [
    # TestPodPhaseWithRestartAlways
    ("Always", [running("a"), running("b")], False, "Running"),
    ("Always", [terminated("a", 0), terminated("b", 1)], False, "Running"),
    ("Always", [running("a"), terminated("b", 0)], False, "Running"),
    ("Always", [running("a")], False, "Pending"),
    ("Always", [running("a"), waiting("b")], False, "Pending"),
    ("Always", [running("a"), waiting("b", last_exit=1)], False, "Running"),
    ("Always", [terminated("a", 0), terminated("b", 0)], True, "Succeeded"),
    ("Always", [terminated("a", 0), terminated("b", 1)], True, "Failed"),
    # TestPodPhaseWithRestartNever
    ("Never", [running("a"), running("b")], False, "Running"),
    ("Never", [terminated("a", 0), terminated("b", 0)], False, "Succeeded"),
    ("Never", [terminated("a", 0), terminated("b", 1)], False, "Failed"),
    ("Never", [running("a"), terminated("b", 1)], False, "Running"),
    ("Never", [running("a")], False, "Pending"),
    # TestPodPhaseWithRestartOnFailure
    ("OnFailure", [terminated("a", 0), terminated("b", 0)], False, "Succeeded"),
    ("OnFailure", [terminated("a", 1), terminated("b", 0)], False, "Running"),
    ("OnFailure", [waiting("a", last_exit=1), terminated("b", 0)], False, "Running"),
]


@pytest.mark.parametrize("policy, statuses, terminal, want", PHASE_CASES)
def test_get_phase_regular(
    policy: str, statuses: list[ContainerStatus], terminal: bool, want: str
) -> None:
    assert get_phase(make_pod(TWO, policy=policy), statuses, pod_is_terminal=terminal) == want


def test_terminal_static_pod_keeps_its_policy_phase() -> None:
    pod = make_pod(TWO, annotations=STATIC)
    assert get_phase(pod, [terminated("a", 0), terminated("b", 1)],
                     pod_is_terminal=True) == "Running"


@pytest.mark.parametrize("policy, statuses, want", [
    ("Always", [running("i"), waiting("a")], "Pending"),
    ("Always", [terminated("i", 0), running("a")], "Running"),
    ("Never", [terminated("i", 1), waiting("a")], "Failed"),
    ("Always", [terminated("i", 1), waiting("a")], "Pending"),
    ("OnFailure", [waiting("i", last_exit=1), waiting("a")], "Pending"),
    ("Never", [waiting("i", last_exit=1)], "Failed"),
    ("Always", [], "Pending"),
])
def test_get_phase_init_containers(
    policy: str, statuses: list[ContainerStatus], want: str
) -> None:
    assert get_phase(make_pod(["a"], init=["i"], policy=policy), statuses) == want


@pytest.mark.parametrize("policy, statuses, want", [
    ("Always", [running("s", started=False), waiting("a")], "Pending"),
    ("Always", [running("s"), running("a")], "Running"),
    ("Always", [running("s", started=False), running("a")], "Running"),
    ("Never", [terminated("s", 137), terminated("a", 0)], "Succeeded"),
    ("Never", [running("s"), terminated("a", 0)], "Running"),
    ("Always", [waiting("s"), running("a")], "Pending"),
    ("Always", [waiting("s", last_exit=1), running("a")], "Running"),
    ("Always", [running("a")], "Pending"),
])
def test_get_phase_sidecars(policy: str, statuses: list[ContainerStatus], want: str) -> None:
    assert get_phase(make_pod(["a"], init=[sidecar("s")], policy=policy), statuses) == want


# -- compute_pod_status --------------------------------------------------------------------


def ready_sandbox(ip: str = "10.1.0.5", **extra: Any) -> RuntimeSandbox:
    return RuntimeSandbox(id="sb", state=SandboxState.READY, ip=ip, **extra)


def instance(name: str, cid: str, state: RuntimeState = RuntimeState.RUNNING,
             **extra: Any) -> RuntimeContainer:
    base: dict[str, Any] = {"image": "busybox:1.36", "image_ref": "sha256:abc",
                            "started_at": NOW - 60}
    return RuntimeContainer(id=cid, name=name, state=state, **{**base, **extra})


def runtime(*containers: RuntimeContainer,
            sandboxes: Sequence[RuntimeSandbox] | None = None) -> RuntimePodStatus:
    return RuntimePodStatus(uid="u-1", name="web", namespace="default",
                            sandboxes=tuple([ready_sandbox()] if sandboxes is None else sandboxes),
                            containers=tuple(containers))


def conditions(status: PodStatus) -> dict[str, PodCondition]:
    return {c.type: c for c in status.conditions}


def test_new_pod_is_pending_and_creating() -> None:
    status = compute_pod_status(make_pod(), runtime(sandboxes=()), now=NOW)
    assert status.phase == "Pending"
    assert status.container_statuses[0].state.waiting == ContainerStateWaiting(
        reason="ContainerCreating")
    assert status.container_statuses[0].image == "busybox:1.36"
    cond = conditions(status)
    assert cond["PodReadyToStartContainers"].status == "False"
    assert cond["Initialized"].status == "True"
    assert cond["ContainersReady"].message == "containers with unready status: [app]"
    assert (cond["Ready"].status, cond["Ready"].reason) == ("False", "ContainersNotReady")
    assert cond["PodScheduled"].status == "True"
    assert all(c.last_transition_time == "2026-11-22T10:00:00Z" for c in status.conditions)
    assert status.start_time == format_time(NOW)
    assert status.qos_class == "BestEffort"
    assert status.pod_ip is None and status.pod_ips == []


def test_running_pod_is_ready() -> None:
    status = compute_pod_status(make_pod(), runtime(instance("app", "c1", restart_count=2)),
                                now=NOW, host_ip="192.168.1.10")
    app = status.container_statuses[0]
    assert status.phase == "Running"
    assert app.state.running == ContainerStateRunning(started_at="2026-11-22T09:59:00Z")
    assert (app.ready, app.started, app.restart_count) == (True, True, 2)
    assert (app.container_id, app.image_id) == ("containerd://c1", "sha256:abc")
    assert all(c.status == "True" for c in status.conditions)
    assert (status.pod_ip, status.host_ip) == ("10.1.0.5", "192.168.1.10")


def test_additional_ips_and_runtime_name() -> None:
    rt = runtime(instance("app", "c1"),
                 sandboxes=[ready_sandbox(additional_ips=("fd00::5",))])
    status = compute_pod_status(make_pod(), rt, now=NOW, runtime_name="cri-o")
    assert status.pod_ips == [PodIP(ip="10.1.0.5"), PodIP(ip="fd00::5")]
    assert status.container_statuses[0].container_id == "cri-o://c1"


def test_readiness_and_startup_probes_gate_ready_and_started() -> None:
    pod = make_pod([{"name": "app", "readinessProbe": PROBE, "startupProbe": PROBE}])
    rt = runtime(instance("app", "c1"))
    before = compute_pod_status(pod, rt, now=NOW).container_statuses[0]
    assert (before.started, before.ready) == (False, False)
    started = compute_pod_status(pod, rt, now=NOW, startup={"c1": ProbeResult.SUCCESS})
    assert (started.container_statuses[0].started, started.container_statuses[0].ready) == (
        True, False)
    ready = compute_pod_status(pod, rt, now=NOW, startup={"c1": ProbeResult.SUCCESS},
                               readiness={"c1": ProbeResult.SUCCESS})
    assert ready.container_statuses[0].ready
    assert conditions(ready)["Ready"].status == "True"


def test_exited_container_with_previous_instance() -> None:
    rt = runtime(
        instance("app", "c2", RuntimeState.EXITED, exit_code=1, reason="Error",
                 message="boom", finished_at=NOW - 5, restart_count=1),
        instance("app", "c1", RuntimeState.EXITED, exit_code=137, reason="OOMKilled"),
    )
    app = compute_pod_status(make_pod(), rt, now=NOW).container_statuses[0]
    assert app.state.terminated == ContainerStateTerminated(
        exit_code=1, reason="Error", message="boom", started_at="2026-11-22T09:59:00Z",
        finished_at="2026-11-22T09:59:55Z", container_id="containerd://c2")
    assert app.last_state.terminated is not None
    assert app.last_state.terminated.reason == "OOMKilled"
    assert app.restart_count == 1
    assert not app.ready and app.started is False


def test_crash_loop_sync_error_becomes_the_waiting_state() -> None:
    message = "back-off 20s restarting failed container=app pod=web_default(u-1)"
    rt = runtime(instance("app", "c2", RuntimeState.EXITED, exit_code=1, reason="Error"))
    status = compute_pod_status(make_pod(), rt, now=NOW,
                                sync_errors={"app": ("CrashLoopBackOff", message)})
    app = status.container_statuses[0]
    assert app.state.waiting == ContainerStateWaiting(reason="CrashLoopBackOff", message=message)
    assert app.last_state.terminated is not None and app.last_state.terminated.exit_code == 1
    assert status.phase == "Running"


def test_sync_error_ignored_for_running_or_never_restarting_containers() -> None:
    errors = {"app": ("CrashLoopBackOff", "x")}
    running_pod = compute_pod_status(make_pod(), runtime(instance("app", "c1")), now=NOW,
                                     sync_errors=errors)
    assert running_pod.container_statuses[0].state.running is not None
    exited = runtime(instance("app", "c1", RuntimeState.EXITED, exit_code=1))
    never = compute_pod_status(make_pod(policy="Never"), exited, now=NOW, sync_errors=errors)
    assert never.container_statuses[0].state.terminated is not None
    assert never.phase == "Failed"


def test_image_error_without_any_instance() -> None:
    status = compute_pod_status(make_pod(), runtime(), now=NOW,
                                sync_errors={"app": ("ErrImageNeverPull", "not present")})
    assert status.container_statuses[0].state.waiting == ContainerStateWaiting(
        reason="ErrImageNeverPull", message="not present")
    assert status.phase == "Pending"


def test_regular_containers_wait_for_initialization() -> None:
    pod = make_pod(["app"], init=["setup"])
    status = compute_pod_status(pod, runtime(instance("setup", "i1")), now=NOW)
    assert status.container_statuses[0].state.waiting == ContainerStateWaiting(
        reason="PodInitializing")
    setup = status.init_container_statuses[0]
    assert setup.state.running is not None and not setup.ready
    init_cond = conditions(status)["Initialized"]
    assert (init_cond.status, init_cond.reason) == ("False", "ContainersNotInitialized")
    assert init_cond.message == "containers with incomplete status: [setup]"
    assert status.phase == "Pending"


def test_completed_init_container_is_ready_and_ignores_sync_errors() -> None:
    pod = make_pod(["app"], init=["setup"])
    rt = runtime(instance("setup", "i1", RuntimeState.EXITED, exit_code=0, reason="Completed"))
    status = compute_pod_status(pod, rt, now=NOW, sync_errors={"setup": ("CrashLoopBackOff", "")})
    setup = status.init_container_statuses[0]
    assert setup.state.terminated is not None and setup.ready
    # Go's default for a pod with init containers, done or not.
    assert status.container_statuses[0].state.waiting == ContainerStateWaiting(
        reason="PodInitializing")
    assert conditions(status)["Initialized"].status == "True"


def test_init_container_behind_a_failing_one_is_pod_initializing() -> None:
    """The NodeConformance spec "should not start app containers if init containers fail
    on a RestartAlways pod": every container not yet created waits with PodInitializing."""
    pod = make_pod(["run1"], init=["init1", "init2"],
                   ephemeralContainers=[{"name": "debug", "image": "busybox"}])
    failed = runtime(instance("init1", "i1", RuntimeState.EXITED, exit_code=1, reason="Error"))
    status = compute_pod_status(pod, failed, now=NOW)
    init1, init2 = status.init_container_statuses
    assert init1.state.terminated is not None and init1.state.terminated.exit_code == 1
    for waiting_status in (init2, *status.container_statuses,
                           *status.ephemeral_container_statuses):
        assert waiting_status.state.waiting == ContainerStateWaiting(reason="PodInitializing")
    backoff = compute_pod_status(pod, failed, now=NOW,
                                 sync_errors={"init1": ("CrashLoopBackOff", "back-off")})
    assert backoff.init_container_statuses[0].state.waiting == ContainerStateWaiting(
        reason="CrashLoopBackOff", message="back-off")
    assert backoff.init_container_statuses[1].state.waiting == ContainerStateWaiting(
        reason="PodInitializing")
    assert backoff.phase == "Pending"
    initialized = conditions(backoff)["Initialized"]
    assert (initialized.status, initialized.reason, initialized.message) == (
        "False", "ContainersNotInitialized", "containers with incomplete status: [init1 init2]")


def test_sidecar_must_be_ready_for_containers_ready() -> None:
    pod = make_pod(["app"], init=[sidecar("proxy", readinessProbe=PROBE)])
    rt = runtime(instance("proxy", "s1"), instance("app", "c1"))
    status = compute_pod_status(pod, rt, now=NOW)
    assert status.phase == "Running"
    assert conditions(status)["Initialized"].status == "True"
    assert conditions(status)["ContainersReady"].message == (
        "containers with unready status: [proxy]")


def test_transition_time_kept_while_status_unchanged() -> None:
    pod = make_pod()
    first = compute_pod_status(pod, runtime(instance("app", "c1")), now=NOW)
    later = compute_pod_status(pod, runtime(instance("app", "c1")), now=NOW + 30, previous=first)
    assert conditions(later)["Ready"].last_transition_time == format_time(NOW)
    exited = runtime(instance("app", "c1", RuntimeState.EXITED, exit_code=1))
    changed = compute_pod_status(pod, exited, now=NOW + 60, previous=later)
    assert conditions(changed)["Ready"].last_transition_time == format_time(NOW + 60)
    assert conditions(changed)["PodScheduled"].last_transition_time == format_time(NOW)
    assert changed.start_time == format_time(NOW)


def test_terminal_phase_never_regresses() -> None:
    pod = make_pod(policy="Never")
    previous = PodStatus(phase="Failed", reason="DeadlineExceeded", message="too slow")
    status = compute_pod_status(pod, runtime(instance("app", "c1")), now=NOW, previous=previous)
    assert (status.phase, status.reason, status.message) == (
        "Failed", "DeadlineExceeded", "too slow")


def test_api_terminal_phase_wins() -> None:
    pod = make_pod(policy="Never")
    pod.status = PodStatus(phase="Succeeded")
    exited = runtime(instance("app", "c1", RuntimeState.EXITED, exit_code=1))
    assert compute_pod_status(pod, exited, now=NOW).phase == "Succeeded"


def test_pod_is_terminal_and_succeeded_conditions() -> None:
    pod = make_pod()
    done = runtime(instance("app", "c1", RuntimeState.EXITED, exit_code=0))
    status = compute_pod_status(pod, done, now=NOW, pod_is_terminal=True)
    assert status.phase == "Succeeded"
    assert conditions(status)["ContainersReady"].reason == "PodCompleted"
    static = make_pod(annotations=STATIC)
    assert compute_pod_status(static, done, now=NOW, pod_is_terminal=True).phase == "Running"


def test_pod_ip_kept_when_the_sandbox_is_gone_and_host_network_uses_host_ip() -> None:
    pod = make_pod()
    first = compute_pod_status(pod, runtime(instance("app", "c1")), now=NOW)
    gone = compute_pod_status(pod, runtime(sandboxes=()), now=NOW, previous=first)
    assert gone.pod_ip == "10.1.0.5"
    host = make_pod(hostNetwork=True)
    rt = runtime(instance("app", "c1"), sandboxes=[ready_sandbox(ip="", host_network=True)])
    status = compute_pod_status(host, rt, now=NOW, host_ip="192.168.1.10")
    assert status.pod_ips == [PodIP(ip="192.168.1.10")]


def test_lost_running_container_counts_as_a_restart() -> None:
    pod = make_pod()
    first = compute_pod_status(pod, runtime(instance("app", "c1", restart_count=3)), now=NOW)
    lost = compute_pod_status(pod, runtime(), now=NOW, previous=first).container_statuses[0]
    assert lost.last_state.terminated is not None
    assert lost.last_state.terminated.reason == "ContainerStatusUnknown"
    assert lost.restart_count == 4
    unknown = compute_pod_status(
        pod, runtime(instance("app", "c1", RuntimeState.UNKNOWN, restart_count=3)),
        now=NOW, previous=first).container_statuses[0]
    assert unknown.state.terminated is not None
    assert unknown.state.terminated.exit_code == 137 and unknown.restart_count == 4


def test_created_container_is_waiting_and_ephemeral_status() -> None:
    pod = make_pod(ephemeralContainers=[{"name": "debug", "image": "busybox"}])
    rt = runtime(instance("app", "c1", RuntimeState.CREATED), instance("debug", "d1"))
    status = compute_pod_status(pod, rt, now=NOW)
    # Created, not started: waiting with no reason, as Go shows it.
    assert status.container_statuses[0].state.waiting == ContainerStateWaiting()
    debug = status.ephemeral_container_statuses[0]
    assert debug.state.running is not None and not debug.ready and debug.started is None


def test_qos_class_and_kept_foreign_conditions() -> None:
    limits = {"cpu": "1", "memory": "1Gi"}
    pod = make_pod([{"name": "app", "resources": {"limits": limits}}])
    pod.status = PodStatus(conditions=[PodCondition(type="example.com/gate", status="True")])
    status = compute_pod_status(pod, runtime(), now=NOW)
    assert status.qos_class == "Guaranteed"
    assert status.conditions[0].type == "example.com/gate"


def gated_pod(**gate_status: str) -> Pod:
    """A pod gated on example.com/a and example.com/b, with those of the conditions given."""
    pod = make_pod(readinessGates=[{"conditionType": "example.com/a"},
                                   {"conditionType": "example.com/b"}])
    pod.status = PodStatus(conditions=[
        PodCondition(type=f"example.com/{name}", status=value)
        for name, value in gate_status.items()
    ])
    return pod


def test_readiness_gates_hold_ready_until_each_condition_is_true() -> None:
    ready_runtime = runtime(instance("app", "c1"))
    unset = conditions(compute_pod_status(gated_pod(), ready_runtime, now=NOW))
    assert unset["ContainersReady"].status == "True"
    assert (unset["Ready"].status, unset["Ready"].reason) == ("False", "ReadinessGatesNotReady")
    assert unset["Ready"].message == (
        'corresponding condition of pod readiness gate "example.com/a" does not exist., '
        'corresponding condition of pod readiness gate "example.com/b" does not exist.')

    half = conditions(compute_pod_status(gated_pod(a="True", b="False"), ready_runtime, now=NOW))
    assert (half["Ready"].status, half["Ready"].message) == (
        "False", 'the status of pod readiness gate "example.com/b" is not "True", but False')

    both = compute_pod_status(gated_pod(a="True", b="True"), ready_runtime, now=NOW)
    assert conditions(both)["Ready"].status == "True" and conditions(both)["Ready"].reason is None
    # The gates' conditions are the pod's, shown as they are; the kubelet never sets them.
    assert [c.type for c in both.conditions[:2]] == ["example.com/a", "example.com/b"]


def test_unready_containers_speak_for_ready_before_the_gates() -> None:
    status = compute_pod_status(gated_pod(), runtime(sandboxes=()), now=NOW)
    ready = conditions(status)["Ready"]
    assert (ready.status, ready.reason, ready.message) == (
        "False", "ContainersNotReady", "containers with unready status: [app]")


def test_a_gate_may_name_a_condition_the_kubelet_computes() -> None:
    pod = make_pod(readinessGates=[{"conditionType": "Initialized"}])
    status = compute_pod_status(pod, runtime(instance("app", "c1")), now=NOW)
    assert conditions(status)["Ready"].status == "True"

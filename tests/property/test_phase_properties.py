"""Invariants of the pod status computation over generated pods and runtime states."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import pods, runtime_statuses

from trio_kubelet.core.observed import ProbeResult
from trio_kubelet.core.phase import compute_pod_status
from trio_kubelet.model.pod import Pod, PodStatus

NOW = 1795341600.0
PHASE_SETTINGS = settings(max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


@PHASE_SETTINGS
@given(st.data(), pods(deleting=None), st.sampled_from(["Succeeded", "Failed"]),
       st.booleans())
def test_terminal_phase_never_regresses(
    data: st.DataObject, pod: Pod, terminal: str, pod_is_terminal: bool
) -> None:
    status = data.draw(runtime_statuses(pod))
    previous = PodStatus(phase=terminal)
    errors = {c.name: ("CrashLoopBackOff", "back-off") for c in pod.spec.containers}
    result = compute_pod_status(pod, status, now=NOW, previous=previous, sync_errors=errors,
                                pod_is_terminal=pod_is_terminal)
    assert result.phase == terminal


@PHASE_SETTINGS
@given(st.data(), pods(deleting=None))
def test_status_is_complete_and_consistent(data: st.DataObject, pod: Pod) -> None:
    status = data.draw(runtime_statuses(pod))
    running = {c.id: ProbeResult.SUCCESS for c in status.containers}
    result = compute_pod_status(pod, status, now=NOW, readiness=running, startup=running)
    assert [s.name for s in result.container_statuses] == [c.name for c in pod.spec.containers]
    assert [s.name for s in result.init_container_statuses] == [
        c.name for c in pod.spec.init_containers]
    for container_status in [*result.container_statuses, *result.init_container_statuses]:
        state = container_status.state
        assert sum(x is not None for x in (state.waiting, state.running, state.terminated)) == 1
        assert not container_status.ready or state.running or state.terminated
    conditions = {c.type: c for c in result.conditions}
    assert conditions["Ready"].status == conditions["ContainersReady"].status
    if result.phase == "Succeeded":
        assert conditions["Ready"].status == "False"
    again = compute_pod_status(pod, status, now=NOW + 10, previous=result,
                               readiness=running, startup=running)
    assert again.phase == result.phase
    assert [c.last_transition_time for c in again.conditions] == [
        c.last_transition_time for c in result.conditions]

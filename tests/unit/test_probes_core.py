"""The probe worker's pure state machine (core/probes.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trio_kubelet.core.observed import ProbeResult
from trio_kubelet.core.probes import (
    INITIAL_RESULT,
    Next,
    ProbeType,
    ProbeView,
    ProbeWorkerState,
    after_probe,
    before_probe,
    initial_jitter,
    next_tick,
    probe_view,
    probed_containers,
)
from trio_kubelet.model.pod import Pod, PodStatus, Probe

S, F = ProbeResult.SUCCESS, ProbeResult.FAILURE
LIVENESS, READINESS, STARTUP = ProbeType.LIVENESS, ProbeType.READINESS, ProbeType.STARTUP
PROBE = Probe.model_validate({"exec": {"command": ["true"]}, "failureThreshold": 3})
RUNNING = ProbeView(container_id="c1", running=True, running_since=100.0, started=True)


def test_new_instance_starts_from_the_initial_result_and_forgets_the_old_one():
    state = ProbeWorkerState(container_id="old", last_result=F, result_run=2, on_hold=True)
    tick = before_probe(READINESS, PROBE, state, RUNNING, now=200.0)
    assert tick.next is Next.PROBE
    assert tick.forget == "old"
    assert tick.publish is INITIAL_RESULT[READINESS] is F
    assert tick.state == ProbeWorkerState(container_id="c1")


def test_no_container_yet_waits_and_a_terminal_pod_stops():
    assert before_probe(LIVENESS, PROBE, ProbeWorkerState(), ProbeView(), 0).next is Next.WAIT
    state = ProbeWorkerState(container_id="c1")
    tick = before_probe(LIVENESS, PROBE, state, ProbeView(pod_terminal=True), 0)
    assert (tick.next, tick.forget) == (Next.STOP, "c1")


def test_a_stopped_container_reads_as_failure_and_stops_only_if_it_cannot_restart():
    state = ProbeWorkerState(container_id="c1")
    stopped = ProbeView(container_id="c1", running=False, may_restart=True)
    tick = before_probe(READINESS, PROBE, state, stopped, 0)
    assert (tick.next, tick.publish) == (Next.WAIT, F)
    final = ProbeView(container_id="c1", running=False, may_restart=False)
    assert before_probe(READINESS, PROBE, state, final, 0).next is Next.STOP


def test_deleting_pod_publishes_liveness_success_and_stops_but_keeps_readiness():
    state = ProbeWorkerState(container_id="c1")
    deleting = ProbeView(pod_deleting=True, container_id="c1", running=True, started=True)
    for kind in (LIVENESS, STARTUP):
        tick = before_probe(kind, PROBE, state, deleting, 1000.0)
        assert (tick.next, tick.publish) == (Next.STOP, S)
    assert before_probe(READINESS, PROBE, state, deleting, 1000.0).next is Next.PROBE


def test_initial_delay_counts_whole_seconds_since_the_container_started():
    probe = PROBE.model_copy(update={"initial_delay_seconds": 5})
    state = ProbeWorkerState(container_id="c1")
    assert before_probe(LIVENESS, probe, state, RUNNING, now=104.9).next is Next.WAIT
    assert before_probe(LIVENESS, probe, state, RUNNING, now=105.0).next is Next.PROBE


def test_startup_probe_runs_only_before_started_and_the_others_only_after():
    state = ProbeWorkerState(container_id="c1")
    not_started = ProbeView(container_id="c1", running=True, started=False)
    assert before_probe(STARTUP, PROBE, state, not_started, 0).next is Next.PROBE
    assert before_probe(LIVENESS, PROBE, state, not_started, 0).next is Next.WAIT
    assert before_probe(READINESS, PROBE, state, not_started, 0).next is Next.WAIT
    assert before_probe(STARTUP, PROBE, state, RUNNING, 0).next is Next.WAIT


def test_on_hold_waits_until_a_new_instance():
    held = ProbeWorkerState(container_id="c1", on_hold=True)
    assert before_probe(LIVENESS, PROBE, held, RUNNING, 500).next is Next.WAIT
    fresh = ProbeView(container_id="c2", running=True, started=True)
    assert before_probe(LIVENESS, PROBE, held, fresh, 500).next is Next.PROBE


def test_liveness_failure_is_published_after_the_threshold_then_holds():
    state = ProbeWorkerState(container_id="c1")
    for _ in range(2):
        tick = after_probe(LIVENESS, PROBE, state, F)
        assert tick.publish is None
        state = tick.state
    tick = after_probe(LIVENESS, PROBE, state, F)
    assert tick.publish is F
    assert tick.state.on_hold and tick.state.result_run == 0


def test_a_different_result_restarts_the_count():
    state = ProbeWorkerState(container_id="c1")
    for result in (F, F, S, F, F):
        tick = after_probe(READINESS, PROBE, state, result)
        state = tick.state
        assert tick.publish is (S if result is S else None)


def test_startup_holds_after_any_published_result():
    tick = after_probe(STARTUP, PROBE, ProbeWorkerState(container_id="c1"), S)
    assert tick.publish is S and tick.state.on_hold


@given(
    kind=st.sampled_from([LIVENESS, READINESS]),
    success=st.integers(1, 4),
    failure=st.integers(1, 4),
    results=st.lists(st.sampled_from([S, F]), max_size=40),
)
def test_a_result_is_published_exactly_when_its_run_reaches_the_threshold(
    kind, success, failure, results
):
    probe = PROBE.model_copy(update={"success_threshold": success, "failure_threshold": failure})
    state = ProbeWorkerState(container_id="c1")
    run, last = 0, None
    for result in results:
        if state.on_hold:
            break
        tick = after_probe(kind, probe, state, result)
        run = run + 1 if result is last else 1
        last = result
        threshold = failure if result is F else success
        assert tick.publish is (result if run >= threshold else None)
        if tick.state.on_hold:
            assert kind is LIVENESS and result is F
            run = 0
        state = tick.state


def test_jitter_only_right_after_the_agent_started():
    assert initial_jitter(10.0, since_agent_start=3.0, fraction=0.5) == 5.0
    assert initial_jitter(10.0, since_agent_start=30.0, fraction=0.5) == 0.0


def test_a_late_wake_up_does_not_shift_later_ticks():
    assert next_tick(100.0, now=100.004, period=10.0) == 110.0  # probe took 4 ms
    assert next_tick(110.0, now=110.250, period=10.0) == 120.0  # woke 250 ms late
    assert next_tick(100.0, now=105.0, period=10.0) == 110.0  # an early manual trigger


def test_ticks_a_slow_probe_overran_are_dropped():
    assert next_tick(100.0, now=125.0, period=10.0) == 130.0
    assert next_tick(100.0, now=130.0, period=10.0) == 140.0


@given(
    previous=st.floats(0, 1e6),
    elapsed=st.floats(0, 1e4),
    period=st.integers(1, 300).map(float),
)
def test_next_tick_is_the_first_grid_point_ahead(previous: float, elapsed: float, period: float):
    now = previous + elapsed
    tick = next_tick(previous, now, period)
    assert now < tick <= now + period + 1e-6
    steps = (tick - previous) / period
    assert abs(steps - round(steps)) < 1e-6 and round(steps) >= 1


def _pod(status: dict | None = None, **spec: object) -> Pod:
    containers = spec.pop("containers", [{"name": "app", "image": "busybox"}])
    return Pod.model_validate({
        "metadata": {"name": "p", "uid": "u1"},
        "spec": {"containers": containers, **spec},
        "status": status or {},
    })


def test_probe_view_reads_the_published_status():
    pod = _pod({"phase": "Running", "containerStatuses": [{
        "name": "app", "containerID": "containerd://abc", "started": True,
        "state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}},
    }]})
    view = probe_view(pod, pod.status, pod.spec.containers[0])
    assert view.container_id == "abc" and view.running and view.started
    assert view.running_since == 1767225610.0
    assert probe_view(pod, PodStatus(), pod.spec.containers[0]) == ProbeView()


def test_a_terminated_container_under_never_cannot_restart():
    pod = _pod({"phase": "Running", "containerStatuses": [{
        "name": "app", "containerID": "containerd://abc",
        "state": {"terminated": {"exitCode": 1}},
    }]}, restartPolicy="Never")
    assert probe_view(pod, pod.status, pod.spec.containers[0]).may_restart is False


def test_probed_containers_include_sidecars_but_not_init_containers():
    probe = {"exec": {"command": ["true"]}}
    pod = _pod(
        containers=[{"name": "app", "image": "b", "livenessProbe": probe, "readinessProbe": probe}],
        initContainers=[
            {"name": "side", "image": "b", "restartPolicy": "Always", "startupProbe": probe},
            {"name": "init", "image": "b"},
        ],
    )
    found = [(c.name, kind) for c, kind, _ in probed_containers(pod)]
    assert found == [("side", STARTUP), ("app", LIVENESS), ("app", READINESS)]

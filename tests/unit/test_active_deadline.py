"""core.active_deadline: how long a pod may still run under spec.activeDeadlineSeconds."""

from __future__ import annotations

from trio_kubelet.core.active_deadline import seconds_to_deadline
from trio_kubelet.core.eviction import evicted_status
from trio_kubelet.model.pod import Pod, PodCondition, PodStatus

START = "2026-11-27T08:00:00Z"
T_START = 1_795_766_400.0  # START in epoch seconds


def pod(deadline: int | None) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "activeDeadlineSeconds": deadline,
        },
    })


def test_the_deadline_counts_from_the_start_time() -> None:
    assert seconds_to_deadline(pod(30), START, T_START + 10) == 20
    assert seconds_to_deadline(pod(30), START, T_START + 30) == 0
    assert seconds_to_deadline(pod(30), START, T_START + 45) == -15


def test_no_deadline_or_no_start_means_no_limit() -> None:
    assert seconds_to_deadline(pod(None), START, T_START + 1e6) is None
    assert seconds_to_deadline(pod(30), None, T_START + 1e6) is None


def test_a_deadline_exceeded_status_is_failed_without_a_disruption_condition() -> None:
    ready = PodCondition(type="Ready", status="False")
    before = PodStatus(phase="Running", conditions=[ready])
    message = "Pod was active on the node longer than the specified deadline"
    after = evicted_status(before, message, T_START, "DeadlineExceeded", disruption=False)
    assert (after.phase, after.reason, after.message) == ("Failed", "DeadlineExceeded", message)
    assert after.conditions == [ready]

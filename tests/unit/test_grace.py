"""kill_grace_period: which grace period a container kill uses (setTerminationGracePeriod)."""

from __future__ import annotations

from typing import Any

import pytest

from trio_kubelet.core.actions import REASON_LIVENESS_PROBE, REASON_STARTUP_PROBE
from trio_kubelet.core.grace import MINIMUM_GRACE_PERIOD_SECONDS, kill_grace_period
from trio_kubelet.model.pod import Pod

PROBE = {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 5}


def make_pod(tgps: int = 30, deletion_grace: int | None = None,
             container: dict[str, Any] | None = None) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "p", "namespace": "d", "uid": "u",
                     "deletionGracePeriodSeconds": deletion_grace},
        "spec": {"terminationGracePeriodSeconds": tgps,
                 "containers": [{"name": "app", "image": "busybox", **(container or {})}]},
    })


def test_pod_termination_grace_period_by_default() -> None:
    pod = make_pod(tgps=45)
    assert kill_grace_period(pod, pod.spec.containers[0], "") == 45


def test_deletion_grace_period_wins() -> None:
    pod = make_pod(tgps=45, deletion_grace=7, container={"livenessProbe": PROBE})
    assert kill_grace_period(pod, pod.spec.containers[0], REASON_LIVENESS_PROBE) == 7


@pytest.mark.parametrize("reason, probe_field", [
    (REASON_LIVENESS_PROBE, "livenessProbe"), (REASON_STARTUP_PROBE, "startupProbe")])
def test_probe_grace_period_for_probe_kills(reason: str, probe_field: str) -> None:
    pod = make_pod(tgps=45, container={probe_field: PROBE})
    assert kill_grace_period(pod, pod.spec.containers[0], reason) == 5
    assert kill_grace_period(pod, pod.spec.containers[0], "") == 45


def test_probe_grace_period_only_for_its_own_probe() -> None:
    pod = make_pod(tgps=45, container={"livenessProbe": PROBE})
    assert kill_grace_period(pod, pod.spec.containers[0], REASON_STARTUP_PROBE) == 45


def test_override_and_floor() -> None:
    pod = make_pod(tgps=0)
    assert kill_grace_period(pod, None, "") == MINIMUM_GRACE_PERIOD_SECONDS
    assert kill_grace_period(pod, None, "", override=60) == 60
    assert kill_grace_period(pod, None, "", override=0) == MINIMUM_GRACE_PERIOD_SECONDS

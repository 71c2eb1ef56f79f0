"""pod_qos_class: Guaranteed, Burstable and BestEffort as GetPodQOS decides them."""

from __future__ import annotations

from typing import Any

import pytest

from trio_kubelet.core.qos import pod_qos_class
from trio_kubelet.model.pod import Pod


def resources(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    return {"requests": requests or {}, "limits": limits or {}}


def pod_with(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
             ephemeral: tuple[dict[str, Any], ...] = ()) -> Pod:
    def named(prefix: str, items: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
        return [{"name": f"{prefix}{i}", "image": "busybox", "resources": r}
                for i, r in enumerate(items)]
    return Pod.model_validate({"spec": {
        "containers": named("c", containers),
        "initContainers": named("i", init),
        "ephemeralContainers": named("e", ephemeral),
    }})


FULL = {"cpu": "500m", "memory": "128Mi"}


@pytest.mark.parametrize("pod, want", [
    (pod_with(resources()), "BestEffort"),
    (pod_with(resources({"cpu": "0"})), "BestEffort"),
    (pod_with(resources({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "1"})), "BestEffort"),
    (pod_with(resources(FULL, FULL)), "Guaranteed"),
    (pod_with(resources(None, FULL)), "Guaranteed"),  # requests default to limits
    (pod_with(resources({"cpu": "0.5", "memory": "134217728"}, FULL)), "Guaranteed"),
    (pod_with(resources(FULL, FULL), resources(FULL, FULL)), "Guaranteed"),
    (pod_with(resources({"cpu": "100m"}, FULL)), "Burstable"),
    (pod_with(resources({"cpu": "100m"})), "Burstable"),
    (pod_with(resources(FULL, {"cpu": "500m"})), "Burstable"),
    (pod_with(resources(FULL, FULL), resources()), "Burstable"),
    (pod_with(resources(FULL, FULL), init=(resources({"memory": "1Gi"}),)), "Burstable"),
    (pod_with(resources(), init=(resources({"cpu": "1"}),)), "Burstable"),
    (pod_with(resources(FULL, FULL), ephemeral=(resources(),)), "Guaranteed"),
])
def test_pod_qos_class(pod: Pod, want: str) -> None:
    assert pod_qos_class(pod) == want

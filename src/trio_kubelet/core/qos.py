"""A pod's QoS class (Guaranteed, Burstable, BestEffort) from its requests and limits.

The rules are ``GetPodQOS`` (pkg/apis/core/v1/helper/qos): only cpu and memory
count; init containers count like regular ones, ephemeral containers not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Literal

from trio_kubelet.model.pod import Container, Pod
from trio_kubelet.model.quantity import parse_quantity

QOSClass = Literal["Guaranteed", "Burstable", "BestEffort"]

_QOS_RESOURCES = ("cpu", "memory")


def _positive(resources: Mapping[str, str | int | float]) -> dict[str, Fraction]:
    """The cpu/memory entries with a value above zero (zero means "not set" for QoS)."""
    found: dict[str, Fraction] = {}
    for name in _QOS_RESOURCES:
        if name in resources:
            value = parse_quantity(resources[name])
            if value > 0:
                found[name] = value
    return found


def _effective_requests(container: Container) -> dict[str, str | int | float]:
    # The API server defaults a missing request to its limit; a static manifest
    # never went through the API server, so apply that default here.
    return {**container.resources.limits, **container.resources.requests}


def qos_class_of(containers: Iterable[Container]) -> QOSClass:
    """The QoS class of a set of containers (the pod's init and regular containers)."""
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for container in containers:
        for name, value in _positive(_effective_requests(container)).items():
            requests[name] = requests.get(name, Fraction(0)) + value
        container_limits = _positive(container.resources.limits)
        for name, value in container_limits.items():
            limits[name] = limits.get(name, Fraction(0)) + value
        if len(container_limits) != len(_QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


def pod_qos_class(pod: Pod) -> QOSClass:
    """The QoS class the kubelet reports in ``status.qosClass``."""
    return qos_class_of([*pod.spec.init_containers, *pod.spec.containers])

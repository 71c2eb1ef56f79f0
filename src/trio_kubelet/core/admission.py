"""Whether the node takes a new pod (the Go kubelet's canAdmitPod), as a pure function.

A pod is checked once, when the agent first learns of it, against the pods it has
already admitted. The checks run in the Go kubelet's order: the eviction manager's
(``Evicted``: under memory pressure no new BestEffort pod, under any other pressure
no new pod at all, critical pods always), sysctls the node does
not allow (``SysctlForbidden``), a pod for another operating system (its
``kubernetes.io/os`` label: ``PodOSSelectorNodeLabelDoesNotMatch``; its ``spec.os``:
``PodOSNotSupported``), then the scheduler's general predicates as the
kubelet re-checks them — a host port another pod holds (``NodePorts``), more pods
than allocatable ``pods`` (``OutOfpods``), and requests beyond what allocatable
has left (``OutOfcpu``, ``OutOfmemory``, ...). A rejected pod is never started;
its status becomes Failed with the reason and "Pod was rejected: <message>".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from trio_kubelet.core.eviction import (
    MEMORY_PRESSURE,
    PRESSURE_CONDITIONS,
    REASON_EVICTED,
    is_critical_pod,
    pressure_admission_message,
    tolerates_memory_pressure,
)
from trio_kubelet.core.pod_cgroups import pod_requests
from trio_kubelet.core.qos import pod_qos_class
from trio_kubelet.core.shutdown import NODE_SHUTDOWN, NOT_ADMITTED_MESSAGE
from trio_kubelet.core.sysctls import sysctl_rejection
from trio_kubelet.model.pod import Pod, PodStatus

SYSCTL_FORBIDDEN = "SysctlForbidden"
POD_OS_SELECTOR_MISMATCH = "PodOSSelectorNodeLabelDoesNotMatch"
POD_OS_NOT_SUPPORTED = "PodOSNotSupported"
NODE_OS = "linux"  # the only operating system this kubelet runs on (Go's runtime.GOOS)
LABEL_OS = "kubernetes.io/os"
NODE_PORTS = "NodePorts"
REJECTED_PREFIX = "Pod was rejected: "
# Checked first, in this order (the scheduler's Fits); other allocatable names follow sorted.
_ORDERED_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_WILDCARD_IPS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why the pod may not run here: the status reason and the message (without the prefix)."""

    reason: str
    message: str


def admit(
    pod: Pod,
    admitted: Sequence[Pod],
    allocatable: Mapping[str, Fraction],
    *,
    allowed_unsafe_sysctls: Sequence[str] = (),
    node_conditions: Collection[str] = (),
) -> Rejection | None:
    """None when ``pod`` may run beside ``admitted``, else the first reason it may not.

    ``node_conditions`` are the pressure conditions the eviction manager reports now, and
    ``NodeShutdown`` while the node shuts down.
    """
    pressure = _pressure_rejection(pod, node_conditions)
    if pressure is not None:
        return pressure
    if NODE_SHUTDOWN in node_conditions:
        return Rejection(NODE_SHUTDOWN, NOT_ADMITTED_MESSAGE)
    forbidden = sysctl_rejection(pod, allowed_unsafe=allowed_unsafe_sysctls)
    if forbidden is not None:
        return Rejection(SYSCTL_FORBIDDEN, forbidden)
    wrong_os = _os_rejection(pod)
    if wrong_os is not None:
        return wrong_os
    if _port_taken(pod, admitted):
        return Rejection(NODE_PORTS, "node(s) didn't have free ports for the requested pod ports")
    return _resource_fit(pod, admitted, allocatable)


def _os_rejection(pod: Pod) -> Rejection | None:
    """A pod labelled or specified for another operating system than the node's."""
    label = pod.metadata.labels.get(LABEL_OS)
    if label is not None and label != NODE_OS:
        return Rejection(
            POD_OS_SELECTOR_MISMATCH,
            f"Failed to admit pod as the `{LABEL_OS}` label doesn't match node label",
        )
    if pod.spec.os is not None and pod.spec.os.name != NODE_OS:
        return Rejection(
            POD_OS_NOT_SUPPORTED, "Failed to admit pod as the OS field doesn't match node OS"
        )
    return None


def _pressure_rejection(pod: Pod, node_conditions: Collection[str]) -> Rejection | None:
    """The eviction manager's admission: a node short of a resource takes no more work."""
    conditions = [c for c in PRESSURE_CONDITIONS if c in node_conditions]
    if not conditions or is_critical_pod(pod):
        return None
    if conditions == [MEMORY_PRESSURE] and (
        pod_qos_class(pod) != "BestEffort" or tolerates_memory_pressure(pod)
    ):
        return None
    return Rejection(REASON_EVICTED, pressure_admission_message(conditions))


def rejected_status(pod: Pod, rejection: Rejection) -> PodStatus:
    """The status of a pod the node refused: Failed, nothing started, the reason shown."""
    return PodStatus(
        phase="Failed",
        reason=rejection.reason,
        message=REJECTED_PREFIX + rejection.message,
        qos_class=pod_qos_class(pod),
    )


def _resource_fit(
    pod: Pod, admitted: Sequence[Pod], allocatable: Mapping[str, Fraction]
) -> Rejection | None:
    max_pods = allocatable.get("pods")
    if max_pods is not None and len(admitted) + 1 > max_pods:
        return _insufficient("pods", 1, len(admitted), math.floor(max_pods))
    wanted = pod_requests(pod)
    if not any(wanted.values()):
        return None
    used: dict[str, Fraction] = {}
    for other in admitted:
        for name, value in pod_requests(other).items():
            used[name] = used.get(name, Fraction(0)) + value
    names = [*_ORDERED_RESOURCES, *sorted(set(wanted) - set(_ORDERED_RESOURCES))]
    for name in names:
        request = wanted.get(name, Fraction(0))
        capacity = allocatable.get(name)
        if request <= 0 or capacity is None:
            # The Go kubelet drops requests for extended resources the node does not have.
            continue
        if request + used.get(name, Fraction(0)) > capacity:
            scale = 1000 if name == "cpu" else 1  # cpu is counted in millicores
            return _insufficient(
                name,
                math.ceil(request * scale),
                math.ceil(used.get(name, Fraction(0)) * scale),
                math.floor(capacity * scale),
            )
    return None


def _insufficient(name: str, requested: int, used: int, capacity: int) -> Rejection:
    return Rejection(
        f"OutOf{name}",
        f"Node didn't have enough resource: {name}, requested: {requested}, used: {used}, "
        f"capacity: {capacity}",
    )


_Port = tuple[str, str, int]  # protocol, host IP, host port


def _host_ports(pod: Pod) -> set[_Port]:
    return {
        (port.protocol, port.host_ip or "", port.host_port)
        for container in (*pod.spec.init_containers, *pod.spec.containers)
        for port in container.ports
        if port.host_port
    }


def _port_taken(pod: Pod, admitted: Iterable[Pod]) -> bool:
    """A host port the pod wants is held already; a wildcard IP on either side clashes."""
    wanted = _host_ports(pod)
    if not wanted:
        return False
    held = {port for other in admitted for port in _host_ports(other)}
    return any(
        protocol == held_protocol
        and port == held_port
        and (ip == held_ip or ip in _WILDCARD_IPS or held_ip in _WILDCARD_IPS)
        for protocol, ip, port in wanted
        for held_protocol, held_ip, held_port in held
    )

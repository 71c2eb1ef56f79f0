"""core.admission: which new pods the node takes, and the status of one it refuses."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from trio_kubelet.core.admission import Rejection, admit, rejected_status
from trio_kubelet.core.pod_cgroups import pod_requests
from trio_kubelet.model.pod import Pod

NODE = {"cpu": Fraction(2), "memory": Fraction(4 * 2**30), "pods": Fraction(3)}


def pod(name: str, requests: dict[str, str] | None = None, **spec: Any) -> Pod:
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36"}
    if requests is not None:
        container["resources"] = {"requests": requests}
    container.update(spec.pop("container", {}))
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"containers": [container], **spec},
    })


def test_a_pod_that_fits_is_admitted() -> None:
    assert admit(pod("a", {"cpu": "1", "memory": "1Gi"}), [pod("b", {"cpu": "1"})], NODE) is None


def test_cpu_beyond_what_is_left_is_refused_in_millicores() -> None:
    rejection = admit(pod("a", {"cpu": "1500m"}), [pod("b", {"cpu": "700m"})], NODE)
    assert rejection == Rejection(
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 1500, used: 700, capacity: 2000",
    )


def test_memory_is_counted_in_bytes() -> None:
    rejection = admit(pod("a", {"memory": "3Gi"}), [pod("b", {"memory": "2Gi"})], NODE)
    assert rejection is not None and rejection.reason == "OutOfmemory"
    assert rejection.message.endswith(
        f"requested: {3 * 2**30}, used: {2 * 2**30}, capacity: {4 * 2**30}"
    )


def test_the_pods_count_is_checked_even_without_requests() -> None:
    others = [pod(str(n)) for n in range(3)]
    assert admit(pod("a"), others, NODE) == Rejection(
        "OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3"
    )
    assert admit(pod("a"), others[:2], NODE) is None


def test_a_limit_without_a_request_counts_as_the_request() -> None:
    greedy = pod("a", container={"resources": {"limits": {"cpu": "3"}}})
    rejection = admit(greedy, [], NODE)
    assert rejection is not None and rejection.reason == "OutOfcpu"


def test_a_resource_the_node_does_not_report_is_not_checked() -> None:
    assert admit(pod("a", {"example.com/gpu": "1"}), [], NODE) is None


def test_a_host_port_held_by_another_pod_is_refused() -> None:
    def with_port(name: str, port: int, ip: str = "", protocol: str = "TCP") -> Pod:
        ports = [{"containerPort": 80, "hostPort": port, "hostIP": ip, "protocol": protocol}]
        return pod(name, container={"ports": ports})

    held = [with_port("b", 8080, "10.0.0.1")]
    assert admit(with_port("a", 8080), held, NODE) == Rejection(
        "NodePorts", "node(s) didn't have free ports for the requested pod ports"
    )
    assert admit(with_port("a", 8080, "10.0.0.1"), held, NODE) is not None
    assert admit(with_port("a", 8080, "10.0.0.2"), held, NODE) is None
    assert admit(with_port("a", 8080, protocol="UDP"), held, NODE) is None
    assert admit(with_port("a", 8081), held, NODE) is None
    assert admit(with_port("a", 8080, "10.0.0.2"), [with_port("b", 8080)], NODE) is not None


def test_sysctls_are_checked_before_resources() -> None:
    unsafe = {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}
    greedy = pod("a", {"cpu": "64"}, securityContext=unsafe)
    assert admit(greedy, [], NODE) == Rejection(
        "SysctlForbidden", 'forbidden sysctl: "kernel.msgmax" not allowlisted'
    )
    allowed = admit(greedy, [], NODE, allowed_unsafe_sysctls=["kernel.msg*"])
    assert allowed is not None and allowed.reason == "OutOfcpu"


def test_a_refused_pod_is_failed_with_the_reason() -> None:
    status = rejected_status(pod("a", {"cpu": "1"}), Rejection("OutOfcpu", "no room"))
    assert (status.phase, status.reason, status.message, status.qos_class) == (
        "Failed", "OutOfcpu", "Pod was rejected: no room", "Burstable"
    )
    assert status.container_statuses == []


@given(st.lists(st.tuples(st.integers(0, 1500), st.integers(0, 3 * 2**30)), max_size=12))
def test_admitted_pods_never_add_up_to_more_than_allocatable(
    wishes: list[tuple[int, int]],
) -> None:
    node = {**NODE, "pods": Fraction(8)}
    admitted: list[Pod] = []
    for index, (millicores, memory) in enumerate(wishes):
        candidate = pod(f"p{index}", {"cpu": f"{millicores}m", "memory": str(memory)})
        rejection = admit(candidate, admitted, node)
        if rejection is None:
            admitted.append(candidate)
        else:
            assert rejection.reason in ("OutOfcpu", "OutOfmemory", "OutOfpods")
    assert len(admitted) <= 8
    for name in ("cpu", "memory"):
        assert sum(pod_requests(p).get(name, Fraction(0)) for p in admitted) <= node[name]


# -- under pressure (the eviction manager's admission) -------------------------------------------


def test_memory_pressure_refuses_only_best_effort_pods() -> None:
    conditions = ["MemoryPressure"]
    assert admit(pod("a"), [], NODE, node_conditions=conditions) == Rejection(
        "Evicted", "The node had condition: [MemoryPressure]. "
    )
    assert admit(pod("a", {"memory": "64Mi"}), [], NODE, node_conditions=conditions) is None
    assert admit(pod("a"), [], NODE) is None


def test_a_best_effort_pod_tolerating_memory_pressure_is_admitted() -> None:
    tolerant = pod("a", tolerations=[{
        "key": "node.kubernetes.io/memory-pressure", "operator": "Exists",
        "effect": "NoSchedule",
    }])
    assert admit(tolerant, [], NODE, node_conditions=["MemoryPressure"]) is None
    # The toleration does not help against other pressure.
    assert admit(tolerant, [], NODE, node_conditions=["MemoryPressure", "DiskPressure"]) == (
        Rejection("Evicted", "The node had condition: [MemoryPressure DiskPressure]. ")
    )


def test_disk_or_pid_pressure_refuses_every_new_pod_but_critical_ones() -> None:
    for condition in ("DiskPressure", "PIDPressure"):
        rejection = admit(pod("a", {"memory": "64Mi"}), [], NODE, node_conditions=[condition])
        assert rejection == Rejection("Evicted", f"The node had condition: [{condition}]. ")
    static = pod("s")
    static.metadata.annotations["kubernetes.io/config.source"] = "file"
    critical = pod("c", priority=2_000_000_000)
    for exempt in (static, critical):
        assert admit(exempt, [], NODE, node_conditions=["DiskPressure"]) is None


def test_pressure_is_checked_before_everything_else() -> None:
    unsafe = {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}
    rejection = admit(pod("a", securityContext=unsafe), [], NODE,
                      node_conditions=["DiskPressure"])
    assert rejection is not None and rejection.reason == "Evicted"


def test_a_pod_for_another_operating_system_is_refused() -> None:
    assert admit(pod("a", os={"name": "windows"}), [], NODE) == Rejection(
        "PodOSNotSupported", "Failed to admit pod as the OS field doesn't match node OS"
    )
    assert admit(pod("a", os={"name": "linux"}), [], NODE) is None
    labelled = pod("a")
    labelled.metadata.labels["kubernetes.io/os"] = "windows"
    assert admit(labelled, [], NODE) == Rejection(
        "PodOSSelectorNodeLabelDoesNotMatch",
        "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
    )
    labelled.metadata.labels["kubernetes.io/os"] = "linux"
    assert admit(labelled, [], NODE) is None

"""metrics: Go kubelet names, labels and buckets; the CRI observer; the text format."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trio_kubelet.metrics import (
    DEF_BUCKETS,
    RUNTIME_OPERATION_BUCKETS,
    AgentMetrics,
    exponential_buckets,
    operation_type,
)
from trio_kubelet.runtime.errors import CRINotFound, StatusCode


def families(text: bytes) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    found: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        found[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return found


@pytest.mark.parametrize(("method", "label"), [
    ("Version", "version"),
    ("ListPodSandbox", "list_podsandbox"),
    ("RunPodSandbox", "run_podsandbox"),
    ("PodSandboxStatus", "podsandbox_status"),
    ("ListPodSandboxStats", "list_podsandbox_stats"),
    ("ListContainers", "list_containers"),
    ("UpdateContainerResources", "update_container"),
    ("ExecSync", "exec_sync"),
    ("ImageFsInfo", "image_fs_info"),
    ("PortForward", "port_forward"),
])
def test_operation_type_is_the_go_label(method: str, label: str) -> None:
    assert operation_type(method) == label


def test_cri_observer_counts_times_and_counts_errors() -> None:
    metrics = AgentMetrics()
    metrics.cri_observer("ListContainers", object(), object(), 0.004)
    metrics.cri_observer("ListContainers", object(), object(), 0.02)
    metrics.cri_observer("ContainerStatus", object(),
                         CRINotFound("ContainerStatus", StatusCode.NOT_FOUND, "gone"), 0.001)
    found = families(metrics.render())
    ops = {s[1]["operation_type"]: s[2] for s in found["kubelet_runtime_operations"]}
    assert ops == {"list_containers": 2.0, "container_status": 1.0}
    errors = {s[1]["operation_type"]: s[2] for s in found["kubelet_runtime_operations_errors"]}
    assert errors == {"container_status": 1.0}
    buckets = [s for s in found["kubelet_runtime_operations_duration_seconds"]
               if s[0].endswith("_bucket") and s[1]["operation_type"] == "list_containers"]
    assert [b[1]["le"] for b in buckets][:3] == ["0.005", "0.0125", "0.03125"]
    assert dict((b[1]["le"], b[2]) for b in buckets)["0.005"] == 1.0


def test_go_buckets() -> None:
    assert DEF_BUCKETS == (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
    assert len(RUNTIME_OPERATION_BUCKETS) == 14
    assert exponential_buckets(1, 2, 4) == (1, 2, 4, 8)


def test_text_format_uses_go_names_and_leaves_out_created_series() -> None:
    metrics = AgentMetrics(node_name="node-a")
    metrics.evictions.labels("memory.available").inc()
    metrics.started_pods.inc()
    text = metrics.render().decode()
    assert "# TYPE kubelet_evictions counter" in text
    assert 'kubelet_evictions{eviction_signal="memory.available"} 1.0' in text
    assert "# TYPE kubelet_started_pods_total counter" in text
    assert "_created" not in text
    assert 'kubelet_node_name{node="node-a"} 1.0' in text
    found = families(metrics.render())
    assert "process_cpu_seconds" in found  # the process collector is in the agent's registry


def test_record_relist_sets_pleg_and_running_figures() -> None:
    metrics = AgentMetrics()
    metrics.record_relist(duration=0.02, interval=1.01, wall_time=1.7e9, running_pods=3,
                          containers_by_state={"running": 5, "exited": 1})
    found = families(metrics.render())
    assert found["kubelet_running_pods"] == [("kubelet_running_pods", {}, 3.0)]
    states = {s[1]["container_state"]: s[2] for s in found["kubelet_running_containers"]}
    assert states == {"created": 0.0, "running": 5.0, "exited": 1.0, "unknown": 0.0}
    assert found["kubelet_pleg_last_seen_seconds"][0][2] == 1.7e9
    counts = {s[0]: s[2] for s in found["kubelet_pleg_relist_interval_seconds"]
              if s[0].endswith("_count")}
    assert counts == {"kubelet_pleg_relist_interval_seconds_count": 1.0}


def test_label_values_are_escaped_and_families_without_samples_are_left_out() -> None:
    metrics = AgentMetrics()
    metrics.prober_probe_total.labels("Liveness", "successful", 'we"ird\\', "p", "ns", "u").inc()
    text = metrics.render_probes().decode()
    assert 'container="we\\"ird\\\\"' in text
    assert "prober_probe_duration_seconds" not in text
    sample = families(metrics.render_probes())["prober_probe"][0]
    assert sample[1]["container"] == 'we"ird\\'
    assert AgentMetrics().render_probes() == b""


def test_two_agents_do_not_share_metrics() -> None:
    first, second = AgentMetrics(), AgentMetrics()
    first.started_pods.inc()
    assert "kubelet_started_pods_total 0.0" in second.render().decode()

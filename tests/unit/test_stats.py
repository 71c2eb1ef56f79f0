"""core.stats and server.routes_stats: samples, the Summary API and the two metrics texts."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as PromSample

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.core.stats import (
    CgroupFigures,
    ContainerReading,
    ContainerRef,
    FsFigures,
    FsUsage,
    MachineInfo,
    NodeReading,
    Sample,
    VolumeUsage,
    build_cadvisor_metrics,
    build_resource_metrics,
    build_sample,
    build_summary,
    cpu_nano_cores,
    memory_limit,
    working_set,
)
from trio_kubelet.core.timestamps import format_time
from trio_kubelet.model.pod import Pod
from trio_kubelet.server.app import create_app
from trio_kubelet.server.routes_stats import stats_blueprint
from trio_kubelet.server.view import NodeView
from trio_kubelet.status.store import PodStatusStore

MiB = 1 << 20
T = 1_700_000_000.0
MACHINE = MachineInfo(num_cores=2, memory_capacity_bytes=4096 * MiB, boot_time=T - 3600,
                      boot_id="b", machine_id="m", system_uuid="u", image_fs_device="/dev/vda")
ROOT_FS = FsFigures(capacity_bytes=100 * MiB, available_bytes=40 * MiB, used_bytes=50 * MiB,
                    inodes=1000, inodes_free=600)
IMAGE_FS = FsFigures(capacity_bytes=200 * MiB, available_bytes=80 * MiB, used_bytes=100 * MiB,
                     inodes=2000, inodes_free=1500)


def ref(id: str, name: str, pod: str = "web", *, sandbox: bool = False,
        namespace: str = "prod") -> ContainerRef:
    return ContainerRef(id=id, name=name, pod_uid=f"uid-{pod}", pod_name=pod,
                        pod_namespace=namespace, image="" if sandbox else "busybox:1.36",
                        created_at=T - (100 if sandbox else 50), cgroup=f"/k8s.io/{id}",
                        sandbox=sandbox)


def figures(cpu_s: float, ws_mib: int, limit_mib: int | None = None) -> CgroupFigures:
    return CgroupFigures(
        cpu_usage_ns=int(cpu_s * 1e9), memory_usage_bytes=(ws_mib + 5) * MiB,
        memory_working_set_bytes=ws_mib * MiB, memory_rss_bytes=ws_mib * MiB // 2,
        memory_cache_bytes=5 * MiB,
        memory_limit_bytes=None if limit_mib is None else limit_mib * MiB,
        memory_failcnt=0, page_faults=100, major_page_faults=1, threads=3,
    )


def node(cpu_s: float) -> NodeReading:
    return NodeReading(figures=figures(cpu_s, 1024), root_fs=ROOT_FS, image_fs=IMAGE_FS,
                       image_fs_usage=FsUsage(used_bytes=30 * MiB, inodes_used=300),
                       max_pid=32768, processes=200)


def readings(cpu_s: float) -> list[ContainerReading]:
    return [
        ContainerReading(ref("sb-web", "", sandbox=True), figures(0.01, 1)),
        ContainerReading(ref("c-app", "app"), figures(cpu_s, 50, limit_mib=128),
                         rootfs=FsUsage(used_bytes=4096, inodes_used=4),
                         logs=FsUsage(used_bytes=8192, inodes_used=2)),
        ContainerReading(ref("c-side", "sidecar"), figures(1.0, 10)),
    ]


def two_samples() -> tuple[Sample, Sample]:
    first = build_sample(timestamp=T, monotonic=100.0, machine=MACHINE, node=node(1000),
                         containers=readings(2.0))
    second = build_sample(timestamp=T + 10, monotonic=110.0, machine=MACHINE, node=node(1010),
                          containers=readings(7.0), previous=first,
                          oom_events={"c-app": 2})
    return first, second


def make_pod(name: str = "web", uid: str = "uid-web") -> Pod:
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": "prod", "uid": uid},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]},
    })


# -- arithmetic ----------------------------------------------------------------------------------


def test_figures_arithmetic() -> None:
    assert working_set(100, 30) == 70 and working_set(100, 130) == 0
    assert working_set(100, None) == 100
    assert memory_limit(9223372036854771712) is None and memory_limit(128) == 128
    assert cpu_nano_cores(1_000, 0.0, 501_000, 2.0) == 250_000
    assert cpu_nano_cores(None, 0.0, 5, 1.0) is None
    assert cpu_nano_cores(10, 0.0, 5, 1.0) is None, "a counter going back is a new cgroup"
    assert cpu_nano_cores(5, 1.0, 10, 1.0) is None
    assert format_time(T + 0.9) == "2023-11-14T22:13:20Z"


def test_build_sample_rates_and_pod_sums() -> None:
    first, second = two_samples()
    (pod,) = second.pods
    assert [c.ref.name for c in pod.containers] == ["app", "sidecar"]
    app = pod.containers[0]
    assert app.cpu_nano_cores == 500_000_000
    assert pod.containers[1].cpu_nano_cores == 0
    assert pod.cpu_nano_cores == 500_000_000
    assert second.node.cpu_nano_cores == 1_000_000_000
    assert pod.figures.memory_working_set_bytes == 61 * MiB
    assert pod.figures.memory_limit_bytes is None, "the sidecar has no limit"
    assert pod.start_time == T - 100
    assert first.pods[0].cpu_nano_cores is None
    assert second.oom_events == {"c-app": 2}


def test_build_sample_uses_runtime_figures_or_drops_the_container() -> None:
    cri = CgroupFigures(cpu_usage_ns=5, memory_working_set_bytes=7)
    sample = build_sample(timestamp=T, monotonic=0.0, machine=MACHINE, node=node(1), containers=[
        ContainerReading(ref("a", "a"), None, cri=cri),
        ContainerReading(ref("b", "b"), None),
    ])
    assert [c.ref.id for c in sample.containers()] == ["a"]
    assert next(sample.containers()).figures is cri


def test_renderings_are_memoised_per_sample() -> None:
    _, sample = two_samples()
    calls: list[str] = []

    def build(value: str) -> str:
        calls.append(value)
        return value

    assert sample.rendered("k", lambda: build("x")) == "x"
    assert sample.rendered("k", lambda: build("y")) == "x"
    assert calls == ["x"]
    assert sample.with_oom_events({}).rendered("k", lambda: "z") == "z"


# -- /stats/summary ------------------------------------------------------------------------------


def test_summary_has_the_statsapi_shape() -> None:
    _, sample = two_samples()
    summary = json.loads(json.dumps(build_summary(sample, "node-1", [make_pod()])))
    assert set(summary) == {"node", "pods"}
    node_stats = summary["node"]
    assert set(node_stats) == {"nodeName", "startTime", "cpu", "memory", "fs", "runtime", "rlimit"}
    assert node_stats["nodeName"] == "node-1"
    assert node_stats["startTime"] == format_time(T - 3600)
    assert node_stats["cpu"] == {"time": format_time(T + 10), "usageNanoCores": 1_000_000_000,
                                 "usageCoreNanoSeconds": 1010 * 10**9}
    assert node_stats["memory"] == {
        "time": format_time(T + 10), "availableBytes": 3072 * MiB, "usageBytes": 1029 * MiB,
        "workingSetBytes": 1024 * MiB, "rssBytes": 512 * MiB, "pageFaults": 100,
        "majorPageFaults": 1}
    assert node_stats["fs"] == {
        "time": format_time(T + 10), "availableBytes": 40 * MiB, "capacityBytes": 100 * MiB,
        "usedBytes": 50 * MiB, "inodesFree": 600, "inodes": 1000, "inodesUsed": 400}
    image_fs = node_stats["runtime"]["imageFs"]
    assert (image_fs["usedBytes"], image_fs["inodesUsed"]) == (30 * MiB, 300), "CRI's figures"
    assert image_fs["capacityBytes"] == 200 * MiB
    assert node_stats["rlimit"] == {"time": format_time(T + 10), "maxpid": 32768, "curproc": 200}

    (pod,) = summary["pods"]
    assert set(pod) == {"podRef", "startTime", "containers", "cpu", "memory",
                        "ephemeral-storage", "process_stats"}
    assert pod["podRef"] == {"name": "web", "namespace": "prod", "uid": "uid-web"}
    assert pod["process_stats"] == {"process_count": 9}
    assert pod["ephemeral-storage"]["usedBytes"] == 4096 + 8192
    assert pod["ephemeral-storage"]["inodesUsed"] == 6
    assert "availableBytes" not in pod["memory"], "no pod limit"
    app, sidecar = pod["containers"]
    assert set(app) == {"name", "startTime", "cpu", "memory", "rootfs", "logs"}
    assert set(sidecar) == {"name", "startTime", "cpu", "memory"}
    assert app["name"] == "app" and app["startTime"] == format_time(T - 50)
    assert app["cpu"]["usageNanoCores"] == 500_000_000
    assert app["memory"]["availableBytes"] == 78 * MiB, "limit - working set"
    assert set(app["memory"]) == {"time", "availableBytes", "usageBytes", "workingSetBytes",
                                  "rssBytes", "pageFaults", "majorPageFaults"}
    assert app["rootfs"]["usedBytes"] == 4096 and app["rootfs"]["capacityBytes"] == 200 * MiB
    assert app["logs"]["usedBytes"] == 8192 and app["logs"]["capacityBytes"] == 100 * MiB


def test_summary_for_metrics_server_has_cpu_and_memory_only() -> None:
    _, sample = two_samples()
    summary = build_summary(sample, "n", [make_pod()], cpu_and_memory_only=True)
    assert set(summary["node"]) == {"nodeName", "startTime", "cpu", "memory"}
    (pod,) = summary["pods"]
    assert set(pod) == {"podRef", "startTime", "containers", "cpu", "memory"}
    assert all(set(c) == {"name", "startTime", "cpu", "memory"} for c in pod["containers"])


def test_summary_reports_ephemeral_storage_only_for_managed_pods() -> None:
    _, sample = two_samples()
    (pod,) = build_summary(sample, "n", [])["pods"]
    assert "ephemeral-storage" not in pod


def test_summary_lists_pod_volumes_and_counts_ephemeral_ones_in_ephemeral_storage() -> None:
    _, sample = two_samples()
    scratch = VolumeUsage("scratch", FsUsage(used_bytes=3 * MiB, inodes_used=3), ROOT_FS,
                          ephemeral=True)
    token = VolumeUsage("token", FsUsage(used_bytes=12288, inodes_used=4), None, ephemeral=False)
    with_volumes = dataclasses.replace(sample, volumes={"uid-web": (scratch, token)})
    (pod,) = build_summary(with_volumes, "n", [make_pod()])["pods"]
    assert pod["volume"] == [
        {"time": format_time(T + 10), "availableBytes": 40 * MiB, "capacityBytes": 100 * MiB,
         "usedBytes": 3 * MiB, "inodesFree": 600, "inodes": 1000, "inodesUsed": 3,
         "name": "scratch"},
        {"time": format_time(T + 10), "usedBytes": 12288, "inodesUsed": 4, "name": "token"},
    ]
    assert pod["ephemeral-storage"]["usedBytes"] == 4096 + 8192 + 3 * MiB  # not the token
    assert pod["ephemeral-storage"]["inodesUsed"] == 6 + 3
    (lean,) = build_summary(with_volumes, "n", [make_pod()], cpu_and_memory_only=True)["pods"]
    assert "volume" not in lean


# -- Prometheus text -----------------------------------------------------------------------------


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def series(family: Any, **labels: str) -> list[PromSample]:
    return [s for s in family.samples if all(s.labels.get(k) == v for k, v in labels.items())]


def one(family: Any, **labels: str) -> PromSample:
    (found,) = series(family, **labels)
    return found


CADVISOR_LABELS = {"container", "id", "image", "name", "namespace", "pod"}


def test_cadvisor_metrics_parse_and_carry_the_kubelet_labels() -> None:
    _, sample = two_samples()
    text = build_cadvisor_metrics(sample)
    parsed = families(text)
    for name in ("container_cpu_usage_seconds_total", "container_memory_working_set_bytes",
                 "container_memory_usage_bytes", "container_memory_rss",
                 "container_oom_events_total", "container_spec_memory_limit_bytes",
                 "container_fs_usage_bytes", "machine_cpu_cores", "machine_memory_bytes"):
        assert name.removesuffix("_total") in parsed, name
    cpu = parsed["container_cpu_usage_seconds"]
    assert cpu.type == "counter"
    app = one(cpu, container="app")
    assert set(app.labels) == CADVISOR_LABELS | {"cpu"}
    assert app.labels == {"container": "app", "cpu": "total", "id": "/k8s.io/c-app",
                          "image": "busybox:1.36", "name": "c-app", "namespace": "prod",
                          "pod": "web"}
    assert app.value == pytest.approx(7.0)
    assert app.timestamp == pytest.approx(T + 10)
    assert one(cpu, id="/").labels["pod"] == "", "the root cgroup is the node"
    assert one(cpu, name="sb-web").labels["container"] == "", "a sandbox has no container name"

    ws = parsed["container_memory_working_set_bytes"]
    assert one(ws, container="app").value == 50 * MiB
    assert all(set(s.labels) == CADVISOR_LABELS for s in ws.samples)
    assert one(parsed["container_memory_rss"], container="app").value == 25 * MiB
    assert one(parsed["container_memory_usage_bytes"], container="app").value == 55 * MiB
    oom = parsed["container_oom_events"]
    assert oom.type == "counter"
    assert one(oom, container="app").value == 2 and one(oom, container="sidecar").value == 0
    limits = parsed["container_spec_memory_limit_bytes"]
    assert one(limits, container="app").value == 128 * MiB
    assert one(limits, container="sidecar").value == 0, "cAdvisor's 0 for no limit"
    fs = parsed["container_fs_usage_bytes"]
    assert [(s.labels["container"], s.labels["device"], s.value) for s in fs.samples] == [
        ("app", "/dev/vda", 4096)]
    machine = one(parsed["machine_memory_bytes"])
    assert machine.value == 4096 * MiB
    assert machine.labels == {"boot_id": "b", "machine_id": "m", "system_uuid": "u"}
    assert one(parsed["machine_cpu_cores"]).value == 2
    assert one(parsed["container_scrape_error"]).value == 0


def test_cadvisor_metrics_without_fs_figures_leave_the_family_out() -> None:
    sample = build_sample(timestamp=T, monotonic=0.0, machine=MACHINE, node=node(1),
                          containers=[ContainerReading(ref("a", "a"), figures(1, 1))])
    assert "container_fs_usage_bytes" not in families(build_cadvisor_metrics(sample))


def test_metrics_before_the_first_sample_are_valid_and_flag_the_error() -> None:
    cadvisor = families(build_cadvisor_metrics(None))
    assert one(cadvisor["container_scrape_error"]).value == 1
    resource = families(build_resource_metrics(None))
    assert one(resource["scrape_error"]).value == 1
    assert one(resource["resource_scrape_error"]).value == 1
    assert set(resource) == {"scrape_error", "resource_scrape_error"}


def test_resource_metrics_are_the_kubelets() -> None:
    _, sample = two_samples()
    parsed = families(build_resource_metrics(sample))
    assert set(parsed) == {
        "container_cpu_usage_seconds", "container_memory_working_set_bytes",
        "container_start_time_seconds", "node_cpu_usage_seconds",
        "node_memory_working_set_bytes", "pod_cpu_usage_seconds",
        "pod_memory_working_set_bytes", "resource_scrape_error", "scrape_error"}
    cpu = parsed["container_cpu_usage_seconds"]
    assert [s.labels for s in cpu.samples] == [
        {"container": "app", "namespace": "prod", "pod": "web"},
        {"container": "sidecar", "namespace": "prod", "pod": "web"},
    ], "containers only: no sandbox, no root"
    assert cpu.samples[0].value == pytest.approx(7.0)
    assert cpu.samples[0].timestamp == pytest.approx(T + 10)
    assert one(parsed["container_memory_working_set_bytes"], container="app").value == 50 * MiB
    start = one(parsed["container_start_time_seconds"], container="app")
    assert start.value == T - 50 and start.timestamp is None
    assert one(parsed["node_cpu_usage_seconds"]).value == pytest.approx(1010)
    assert one(parsed["node_memory_working_set_bytes"]).value == 1024 * MiB
    pod_cpu = one(parsed["pod_cpu_usage_seconds"])
    assert pod_cpu.labels == {"namespace": "prod", "pod": "web"}
    assert pod_cpu.value == pytest.approx(8.01)
    assert one(parsed["pod_memory_working_set_bytes"]).value == 61 * MiB
    assert one(parsed["scrape_error"]).value == 0
    assert "[STABLE]" in build_resource_metrics(sample).splitlines()[0]


def test_resource_metrics_report_a_runtime_error() -> None:
    sample = build_sample(timestamp=T, monotonic=0.0, machine=MACHINE, node=node(1),
                          containers=[], errors=["listing containers: unavailable"])
    assert one(families(build_resource_metrics(sample))["resource_scrape_error"]).value == 1
    assert one(families(build_cadvisor_metrics(sample))["container_scrape_error"]).value == 1


def test_label_values_are_escaped() -> None:
    odd = ContainerRef(id="x", name='a"b\\c\nd', pod_uid="u", pod_name="p", pod_namespace="n",
                       image="i", created_at=T, cgroup="/x")
    sample = build_sample(timestamp=T, monotonic=0.0, machine=MACHINE, node=node(1),
                          containers=[ContainerReading(odd, figures(1, 1))])
    for text in (build_cadvisor_metrics(sample), build_resource_metrics(sample)):
        cpu = families(text)["container_cpu_usage_seconds"]
        assert 'a"b\\c\nd' in {s.labels.get("container") for s in cpu.samples}


# -- the routes ----------------------------------------------------------------------------------


class Latest:
    def __init__(self) -> None:
        self.sample: Sample | None = None

    def __call__(self) -> Sample | None:
        return self.sample


def make_view(latest: Latest, pods: Iterable[Pod] = ()) -> NodeView:
    store = PodStatusStore()
    for pod in pods:
        store.set(pod, pod.status)
    return NodeView(options=AgentOptions(config=KubeletConfiguration(), node_name="node-1"),
                    store=store, client=None,  # type: ignore[arg-type]
                    last_relist=lambda: None, last_sync_loop=lambda: None,
                    latest_sample=latest)


async def test_routes_serve_the_latest_sample() -> None:
    latest = Latest()
    view = make_view(latest, [make_pod()])
    client = create_app(view, [stats_blueprint(view)]).test_client()

    response = await client.get("/stats/summary")
    assert response.status_code == 500, "the Go kubelet's answer while it has no stats"
    assert (await response.get_data(as_text=True)).startswith("Internal Error:")
    response = await client.get("/metrics/resource")
    assert response.status_code == 200
    assert one(families(await response.get_data(as_text=True))["scrape_error"]).value == 1

    _, latest.sample = two_samples()
    response = await client.get("/stats/summary")
    assert response.status_code == 200 and response.content_type == "application/json"
    summary = await response.get_json()
    assert summary["node"]["nodeName"] == "node-1"
    assert "ephemeral-storage" in summary["pods"][0]
    response = await client.post("/stats/summary?only_cpu_and_memory=true")
    assert set((await response.get_json())["node"]) == {"nodeName", "startTime", "cpu", "memory"}
    response = await client.get("/stats/summary?only_cpu_and_memory=true&only_cpu_and_memory=1")
    assert "fs" in (await response.get_json())["node"], "Go wants exactly one value, true"

    for path in ("/metrics/cadvisor", "/metrics/resource"):
        response = await client.get(path)
        assert response.status_code == 200
        assert response.content_type == "text/plain; version=0.0.4; charset=utf-8"
        body = await response.get_data(as_text=True)
        assert "container_cpu_usage_seconds_total" in body
        assert body == await (await client.get(path)).get_data(as_text=True)
    assert (await client.put("/metrics/cadvisor")).status_code == 405

    response = await client.get("/metrics/cadvisor", headers={"Accept-Encoding": "gzip, br"})
    assert response.headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(await response.get_data()).decode()
    assert "machine_memory_bytes" in families(text)
    response = await client.get("/metrics/resource", headers={"Accept-Encoding": "gzip;q=0"})
    assert "Content-Encoding" not in response.headers

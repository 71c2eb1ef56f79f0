"""Resource figures of the node, its pods and containers, and the kubelet's renderings of them.

A `Sample` is what the sampler (``sources/sampler.py``) measured at one instant,
already combined with the previous sample (CPU rates) and summed per pod. The
builders turn a sample into the Summary API JSON (``/stats/summary``,
``k8s.io/kubelet/pkg/apis/stats/v1alpha1``) and into the Prometheus text of
``/metrics/cadvisor`` and ``/metrics/resource``. Everything here is pure: figures
in, figures or text out; no clock reads and no file system.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

from trio_kubelet.core.timestamps import format_time
from trio_kubelet.model.pod import Pod

# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB
# pages); cAdvisor treats anything above 2^62 as unlimited.
UNLIMITED_THRESHOLD = 1 << 62
NS_PER_SECOND = 1_000_000_000
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


# -- the figures -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupFigures:
    """One cgroup's (or a sum of cgroups') counters and gauges; None where unknown."""

    cpu_usage_ns: int | None = None
    memory_usage_bytes: int | None = None
    memory_working_set_bytes: int | None = None
    memory_rss_bytes: int | None = None
    memory_cache_bytes: int | None = None
    memory_limit_bytes: int | None = None  # None: no limit
    memory_failcnt: int | None = None
    page_faults: int | None = None
    major_page_faults: int | None = None
    threads: int | None = None  # pids.current: tasks, so threads count


@dataclass(frozen=True, slots=True)
class FsFigures:
    """A filesystem as statvfs sees it."""

    capacity_bytes: int
    available_bytes: int  # for unprivileged users (f_bavail)
    used_bytes: int  # capacity - free (f_bfree): what cAdvisor reports as usage
    inodes: int
    inodes_free: int


@dataclass(frozen=True, slots=True)
class FsUsage:
    """What one consumer (a container's writable layer, its logs) uses of a filesystem."""

    used_bytes: int | None = None
    inodes_used: int | None = None


@dataclass(frozen=True, slots=True)
class VolumeUsage:
    """One pod volume: what it uses (du), its filesystem (statvfs), and whether it is local
    ephemeral storage (on the node's disk: emptyDir without a medium, configMap)."""

    name: str
    usage: FsUsage
    fs: FsFigures | None
    ephemeral: bool


_NO_VOLUMES: Mapping[str, tuple[VolumeUsage, ...]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """Who a cgroup belongs to, from the CRI labels; ``name`` is "" for a pod sandbox."""

    id: str
    name: str
    pod_uid: str
    pod_name: str
    pod_namespace: str
    image: str
    created_at: float  # epoch seconds
    cgroup: str  # relative to each controller's root, e.g. "/k8s.io/<id>"
    sandbox: bool = False


@dataclass(frozen=True, slots=True)
class ContainerReading:
    """What one tick read for one container, before rates and sums."""

    ref: ContainerRef
    figures: CgroupFigures | None  # None: no cgroup (gone, or not reachable)
    cri: CgroupFigures | None = None  # CRI ListContainerStats cpu/memory, the fallback
    rootfs: FsUsage | None = None
    logs: FsUsage | None = None


@dataclass(frozen=True, slots=True)
class ContainerSample:
    ref: ContainerRef
    figures: CgroupFigures
    cpu_nano_cores: int | None = None
    rootfs: FsUsage | None = None
    logs: FsUsage | None = None


@dataclass(frozen=True, slots=True)
class PodSample:
    uid: str
    name: str
    namespace: str
    start_time: float  # the sandbox's creation (the Go CRI stats provider's choice)
    figures: CgroupFigures  # containers and sandbox summed (there is no pod cgroup yet)
    cpu_nano_cores: int | None
    containers: tuple[ContainerSample, ...]  # without the sandbox
    sandbox: ContainerSample | None = None

    def members(self) -> Iterator[ContainerSample]:
        if self.sandbox is not None:
            yield self.sandbox
        yield from self.containers


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """Facts about the machine that do not change while the agent runs."""

    num_cores: int
    memory_capacity_bytes: int
    boot_time: float = 0.0  # epoch seconds
    boot_id: str = ""
    machine_id: str = ""
    system_uuid: str = ""
    image_fs_device: str = ""


@dataclass(frozen=True, slots=True)
class NodeReading:
    """The node-level figures one tick read (the root cgroup, /proc, statvfs, CRI)."""

    figures: CgroupFigures
    pods: CgroupFigures | None = None  # the cgroup all pods are in (kubepods), when read
    root_fs: FsFigures | None = None
    image_fs: FsFigures | None = None
    image_fs_usage: FsUsage | None = None  # bytes/inodes the images take (CRI ImageFsInfo)
    max_pid: int | None = None
    processes: int | None = None


@dataclass(frozen=True, slots=True)
class NodeSample:
    reading: NodeReading
    cpu_nano_cores: int | None = None

    @property
    def figures(self) -> CgroupFigures:
        return self.reading.figures


@dataclass(frozen=True)
class Sample:
    """Everything measured at one instant. Immutable; the servers render it on demand."""

    timestamp: float  # epoch seconds
    monotonic: float  # trio's clock, for rates
    machine: MachineInfo
    node: NodeSample
    pods: tuple[PodSample, ...]
    oom_events: Mapping[str, int] = field(default_factory=lambda: _NO_COUNTS)  # id -> OOM kills
    errors: tuple[str, ...] = ()  # what could not be read this tick (scrape_error)
    # Pod UID -> its volumes, as last measured (every minute, not every tick).
    volumes: Mapping[str, tuple[VolumeUsage, ...]] = field(default_factory=lambda: _NO_VOLUMES)
    # Renderings of this sample, kept so repeated scrapes of one sample cost nothing.
    _rendered: dict[Hashable, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def containers(self) -> Iterator[ContainerSample]:
        """Every container and sandbox of every pod."""
        for pod in self.pods:
            yield from pod.members()

    def with_oom_events(self, counts: Mapping[str, int]) -> Sample:
        return replace(self, oom_events=MappingProxyType(dict(counts)))

    def rendered(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """``build()``, computed once per sample and ``key``: builders are pure."""
        try:
            return self._rendered[key]
        except KeyError:
            value = self._rendered[key] = build()
            return value


# -- arithmetic ---------------------------------------------------------------------------------


def memory_limit(raw: int | None) -> int | None:
    """A memory.limit_in_bytes value, or None when it means "no limit"."""
    if raw is None or raw > UNLIMITED_THRESHOLD:
        return None
    return raw


def working_set(usage: int, inactive_file: int | None) -> int:
    """cAdvisor's working set: usage minus the inactive file cache, never below zero."""
    if inactive_file is None:
        return usage
    return max(0, usage - inactive_file)


def cpu_nano_cores(
    previous_ns: int | None, previous_t: float, current_ns: int | None, current_t: float
) -> int | None:
    """Average CPU use between two readings in nano-cores (core-nanoseconds per second)."""
    if previous_ns is None or current_ns is None or current_ns < previous_ns:
        return None
    window = current_t - previous_t
    if window <= 0:
        return None
    return round((current_ns - previous_ns) / window)


def _sum(values: Iterable[int | None]) -> int | None:
    total: int | None = None
    for value in values:
        if value is not None:
            total = value if total is None else total + value
    return total


def sum_figures(members: Sequence[CgroupFigures], limits: Sequence[int | None] = ()) -> (
    CgroupFigures
):
    """Figures of a group of cgroups; the limit is the sum of ``limits`` if all are set."""
    limit = None if not limits or any(v is None for v in limits) else _sum(limits)
    return CgroupFigures(
        cpu_usage_ns=_sum(m.cpu_usage_ns for m in members),
        memory_usage_bytes=_sum(m.memory_usage_bytes for m in members),
        memory_working_set_bytes=_sum(m.memory_working_set_bytes for m in members),
        memory_rss_bytes=_sum(m.memory_rss_bytes for m in members),
        memory_cache_bytes=_sum(m.memory_cache_bytes for m in members),
        memory_limit_bytes=limit,
        memory_failcnt=_sum(m.memory_failcnt for m in members),
        page_faults=_sum(m.page_faults for m in members),
        major_page_faults=_sum(m.major_page_faults for m in members),
        threads=_sum(m.threads for m in members),
    )


def _container_sample(
    reading: ContainerReading, previous: Mapping[str, int | None], previous_t: float, now: float
) -> ContainerSample | None:
    figures = reading.figures if reading.figures is not None else reading.cri
    if figures is None:
        return None  # the container is gone and the runtime has nothing either
    rate = cpu_nano_cores(previous.get(reading.ref.id), previous_t, figures.cpu_usage_ns, now)
    return ContainerSample(
        ref=reading.ref, figures=figures, cpu_nano_cores=rate,
        rootfs=reading.rootfs, logs=reading.logs,
    )


def _pod_sample(members: list[ContainerSample]) -> PodSample:
    sandbox = next((m for m in members if m.ref.sandbox), None)
    containers = tuple(sorted((m for m in members if not m.ref.sandbox),
                              key=lambda m: (m.ref.name, m.ref.created_at)))
    first = members[0].ref
    start = sandbox.ref.created_at if sandbox else min(m.ref.created_at for m in members)
    rates = [m.cpu_nano_cores for m in members]
    return PodSample(
        uid=first.pod_uid, name=first.pod_name, namespace=first.pod_namespace,
        start_time=start,
        figures=sum_figures([m.figures for m in members],
                            [c.figures.memory_limit_bytes for c in containers]),
        cpu_nano_cores=_sum(rates),
        containers=containers, sandbox=sandbox,
    )


def build_sample(
    *,
    timestamp: float,
    monotonic: float,
    machine: MachineInfo,
    node: NodeReading,
    containers: Iterable[ContainerReading],
    previous: Sample | None = None,
    oom_events: Mapping[str, int] = _NO_COUNTS,
    errors: Sequence[str] = (),
    volumes: Mapping[str, tuple[VolumeUsage, ...]] = _NO_VOLUMES,
) -> Sample:
    """Combine one tick's readings with the previous sample: rates, per-pod sums.

    A container without a cgroup falls back to the runtime's figures and is
    dropped when it has none (it exited between the list and the read).
    """
    previous_cpu: dict[str, int | None] = {}
    previous_t = monotonic
    node_rate = None
    if previous is not None:
        previous_t = previous.monotonic
        previous_cpu = {c.ref.id: c.figures.cpu_usage_ns for c in previous.containers()}
        node_rate = cpu_nano_cores(previous.node.figures.cpu_usage_ns, previous_t,
                                   node.figures.cpu_usage_ns, monotonic)
    by_pod: dict[str, list[ContainerSample]] = {}
    for reading in containers:
        sample = _container_sample(reading, previous_cpu, previous_t, monotonic)
        if sample is not None:
            by_pod.setdefault(sample.ref.pod_uid, []).append(sample)
    pods = tuple(sorted((_pod_sample(members) for members in by_pod.values()),
                        key=lambda p: (p.namespace, p.name, p.uid)))
    return Sample(
        timestamp=timestamp, monotonic=monotonic, machine=machine,
        node=NodeSample(reading=node, cpu_nano_cores=node_rate), pods=pods,
        oom_events=MappingProxyType(dict(oom_events)), errors=tuple(errors), volumes=volumes,
    )


# -- /stats/summary -----------------------------------------------------------------------------


def _put(target: dict[str, Any], key: str, value: int | None) -> None:
    if value is not None:
        target[key] = value


def _cpu_json(time: str, figures: CgroupFigures, rate: int | None) -> dict[str, Any] | None:
    if figures.cpu_usage_ns is None and rate is None:
        return None
    cpu: dict[str, Any] = {"time": time}
    _put(cpu, "usageNanoCores", rate)
    _put(cpu, "usageCoreNanoSeconds", figures.cpu_usage_ns)
    return cpu


def _memory_json(time: str, figures: CgroupFigures, limit: int | None) -> dict[str, Any] | None:
    if figures.memory_usage_bytes is None and figures.memory_working_set_bytes is None:
        return None
    memory: dict[str, Any] = {"time": time}
    ws = figures.memory_working_set_bytes
    if limit is not None and ws is not None:
        memory["availableBytes"] = max(0, limit - ws)
    _put(memory, "usageBytes", figures.memory_usage_bytes)
    _put(memory, "workingSetBytes", ws)
    _put(memory, "rssBytes", figures.memory_rss_bytes)
    _put(memory, "pageFaults", figures.page_faults)
    _put(memory, "majorPageFaults", figures.major_page_faults)
    return memory


def _fs_json(
    time: str, fs: FsFigures | None, usage: FsUsage | None = None
) -> dict[str, Any] | None:
    """An FsStats: capacity from the filesystem, usage from the consumer when given."""
    if fs is None and usage is None:
        return None
    out: dict[str, Any] = {"time": time}
    if fs is not None:
        out["availableBytes"] = fs.available_bytes
        out["capacityBytes"] = fs.capacity_bytes
    if usage is not None:
        _put(out, "usedBytes", usage.used_bytes)
    elif fs is not None:
        out["usedBytes"] = fs.used_bytes
    if fs is not None:
        out["inodesFree"] = fs.inodes_free
        out["inodes"] = fs.inodes
    if usage is not None:
        _put(out, "inodesUsed", usage.inodes_used)
    elif fs is not None:
        out["inodesUsed"] = fs.inodes - fs.inodes_free
    return out


def _set(target: dict[str, Any], key: str, value: dict[str, Any] | None) -> None:
    if value is not None:
        target[key] = value


def _container_json(
    time: str, c: ContainerSample, node: NodeReading, cpu_and_memory_only: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": c.ref.name, "startTime": format_time(c.ref.created_at)}
    _set(out, "cpu", _cpu_json(time, c.figures, c.cpu_nano_cores))
    _set(out, "memory", _memory_json(time, c.figures, c.figures.memory_limit_bytes))
    if not cpu_and_memory_only:
        # The writable layer lives on the image filesystem, the logs on the node's.
        if c.rootfs is not None:
            _set(out, "rootfs", _fs_json(time, node.image_fs, c.rootfs))
        if c.logs is not None:
            _set(out, "logs", _fs_json(time, node.root_fs, c.logs))
    return out


def ephemeral_usage(pod: PodSample, volumes: Sequence[VolumeUsage]) -> FsUsage | None:
    """The pod's ephemeral storage: its containers' writable layers and logs plus its
    local ephemeral volumes; None when none of it is known."""
    usages = [u for c in pod.containers for u in (c.rootfs, c.logs) if u]
    usages += [v.usage for v in volumes if v.ephemeral]
    used = _sum(u.used_bytes for u in usages)
    inodes = _sum(u.inodes_used for u in usages)
    if used is None and inodes is None:
        return None
    return FsUsage(used_bytes=used, inodes_used=inodes)


def _ephemeral_storage(
    time: str, pod: PodSample, node: NodeReading, volumes: Sequence[VolumeUsage]
) -> dict[str, Any] | None:
    usage = ephemeral_usage(pod, volumes)
    return None if usage is None else _fs_json(time, node.root_fs, usage)


def _volume_json(time: str, volume: VolumeUsage) -> dict[str, Any]:
    out = _fs_json(time, volume.fs, volume.usage) or {"time": time}
    out["name"] = volume.name
    return out


def _pod_json(
    time: str,
    pod: PodSample,
    node: NodeReading,
    known: bool,
    cpu_and_memory_only: bool,
    volumes: Sequence[VolumeUsage] = (),
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "podRef": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
        "startTime": format_time(pod.start_time),
        "containers": [_container_json(time, c, node, cpu_and_memory_only)
                       for c in pod.containers],
    }
    _set(out, "cpu", _cpu_json(time, pod.figures, pod.cpu_nano_cores))
    _set(out, "memory", _memory_json(time, pod.figures, pod.figures.memory_limit_bytes))
    if cpu_and_memory_only:
        return out
    if volumes:
        out["volume"] = [_volume_json(time, v) for v in volumes]
    if known:  # the Go kubelet reports ephemeral storage only for pods it manages
        _set(out, "ephemeral-storage", _ephemeral_storage(time, pod, node, volumes))
    if pod.figures.threads is not None:
        out["process_stats"] = {"process_count": pod.figures.threads}
    return out


def _node_json(
    node_name: str, sample: Sample, time: str, cpu_and_memory_only: bool
) -> dict[str, Any]:
    reading = sample.node.reading
    out: dict[str, Any] = {
        "nodeName": node_name, "startTime": format_time(sample.machine.boot_time)
    }
    _set(out, "cpu", _cpu_json(time, reading.figures, sample.node.cpu_nano_cores))
    # The root cgroup has no limit of its own: the machine's memory is the limit.
    _set(out, "memory", _memory_json(time, reading.figures, sample.machine.memory_capacity_bytes))
    if cpu_and_memory_only:
        return out
    _set(out, "fs", _fs_json(time, reading.root_fs))
    image_fs = _fs_json(time, reading.image_fs, reading.image_fs_usage)
    if image_fs is not None:
        out["runtime"] = {"imageFs": image_fs, "containerFs": image_fs}
    if reading.max_pid is not None or reading.processes is not None:
        rlimit: dict[str, Any] = {"time": time}
        _put(rlimit, "maxpid", reading.max_pid)
        _put(rlimit, "curproc", reading.processes)
        out["rlimit"] = rlimit
    return out


def build_summary(
    sample: Sample,
    node_name: str,
    pods: Sequence[Pod] = (),
    *,
    cpu_and_memory_only: bool = False,
) -> dict[str, Any]:
    """The Summary API object (``statsapi.Summary``) of ``sample``.

    ``pods`` are the pods the agent manages; only they get ephemeral-storage
    figures, as in the Go kubelet. ``cpu_and_memory_only`` is the
    ``only_cpu_and_memory=true`` form metrics-server asks for.
    """
    time = format_time(sample.timestamp)
    known = {pod.metadata.uid for pod in pods}
    return {
        "node": _node_json(node_name, sample, time, cpu_and_memory_only),
        "pods": [_pod_json(time, pod, sample.node.reading, pod.uid in known, cpu_and_memory_only,
                           sample.volumes.get(pod.uid, ()))
                 for pod in sample.pods],
    }


def summary_json(
    sample: Sample, node_name: str, pods: Sequence[Pod] = (), *, cpu_and_memory_only: bool = False
) -> bytes:
    summary = build_summary(sample, node_name, pods, cpu_and_memory_only=cpu_and_memory_only)
    return json.dumps(summary, separators=(",", ":")).encode()


# -- Prometheus text ----------------------------------------------------------------------------


def escape_label(value: str) -> str:
    """A label value as the Prometheus text format writes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def escape_help(text: str) -> str:
    """A HELP text as the Prometheus text format writes it."""
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _value(value: float) -> str:
    if isinstance(value, int) or (value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{name}="{escape_label(value)}"' for name, value in pairs)


class _Exposition:
    """Prometheus text format 0.0.4, written family by family."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._families: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self._families

    def family(self, name: str, kind: str, help: str) -> None:
        self._families.add(name)
        self._lines.append(f"# HELP {name} {escape_help(help)}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(
        self, name: str, labels: str, value: float | None, timestamp_ms: int | None = None
    ) -> None:
        if value is None:
            return
        series = f"{name}{{{labels}}}" if labels else name
        if timestamp_ms is None:
            self._lines.append(f"{series} {_value(value)}")
        else:
            self._lines.append(f"{series} {_value(value)} {timestamp_ms}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n" if self._lines else ""


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / NS_PER_SECOND


@dataclass(frozen=True, slots=True)
class _Series:
    """One cAdvisor container row: its label string and its figures."""

    labels: str
    labels_with_cpu: str
    sample: ContainerSample | None  # None: the root cgroup
    figures: CgroupFigures
    start_time: float | None


def _cadvisor_series(sample: Sample) -> list[_Series]:
    """The root cgroup "/" plus every container and sandbox, labelled as the kubelet does.

    All six labels are always present (blank when unknown); ``name`` is the
    runtime's name for the container, which for containerd is its id.
    """
    def row(labels: dict[str, str], c: ContainerSample | None, figures: CgroupFigures,
            start: float | None) -> _Series:
        ordered = sorted(labels.items())
        with_cpu = sorted([*labels.items(), ("cpu", "total")])
        return _Series(_labels(ordered), _labels(with_cpu), c, figures, start)

    root = {"container": "", "id": "/", "image": "", "name": "", "namespace": "", "pod": ""}
    rows = [row(root, None, sample.node.figures, sample.machine.boot_time or None)]
    for c in sample.containers():
        labels = {
            "container": c.ref.name, "id": c.ref.cgroup, "image": c.ref.image,
            "name": c.ref.id, "namespace": c.ref.pod_namespace, "pod": c.ref.pod_name,
        }
        rows.append(row(labels, c, c.figures, c.ref.created_at))
    return rows


@dataclass(frozen=True, slots=True)
class _Family:
    name: str
    kind: str
    help: str
    value: Callable[[_Series, Sample], float | None]
    containers_only: bool = False  # no row for the root cgroup
    extra: Literal["", "cpu", "device"] = ""  # the family's own label
    spec: bool = False  # cAdvisor writes spec figures without a timestamp


def _oom_events(r: _Series, s: Sample) -> int:
    return s.oom_events.get(r.sample.ref.id, 0) if r.sample is not None else 0


def _rootfs_used(r: _Series, s: Sample) -> int | None:
    rootfs = r.sample.rootfs if r.sample is not None else None
    return rootfs.used_bytes if rootfs is not None else None


_SCRAPE_ERROR_HELP = "1 if there was an error while getting container metrics, 0 otherwise"

# cAdvisor's families the kubelet serves, in name order (as a Go registry writes them);
# container_scrape_error (no labels, one value) sorts between oom_events and spec_memory.
_CADVISOR_FAMILIES = (
    _Family("container_cpu_usage_seconds_total", "counter",
            "Cumulative cpu time consumed in seconds.",
            lambda r, s: _seconds(r.figures.cpu_usage_ns), extra="cpu"),
    _Family("container_fs_usage_bytes", "gauge",
            "Number of bytes that are consumed by the container on this filesystem.",
            _rootfs_used, containers_only=True, extra="device"),
    _Family("container_memory_cache", "gauge", "Number of bytes of page cache memory.",
            lambda r, s: r.figures.memory_cache_bytes),
    _Family("container_memory_failcnt", "counter", "Number of memory usage hits limits",
            lambda r, s: r.figures.memory_failcnt),
    _Family("container_memory_rss", "gauge", "Size of RSS in bytes.",
            lambda r, s: r.figures.memory_rss_bytes),
    _Family("container_memory_usage_bytes", "gauge",
            "Current memory usage in bytes, including all memory regardless of when it was "
            "accessed", lambda r, s: r.figures.memory_usage_bytes),
    _Family("container_memory_working_set_bytes", "gauge", "Current working set in bytes.",
            lambda r, s: r.figures.memory_working_set_bytes),
    _Family("container_oom_events_total", "counter",
            "Count of out of memory events observed for the container",
            _oom_events, containers_only=True),
    _Family("container_spec_memory_limit_bytes", "gauge", "Memory limit for the container.",
            lambda r, s: r.figures.memory_limit_bytes or 0, containers_only=True, spec=True),
    _Family("container_start_time_seconds", "gauge",
            "Start time of the container since unix epoch in seconds.",
            lambda r, s: r.start_time, spec=True),
    _Family("container_threads", "gauge", "Number of threads running inside the container",
            lambda r, s: r.figures.threads),
)


def build_cadvisor_metrics(sample: Sample | None) -> str:
    """``/metrics/cadvisor``: cAdvisor's container metrics with the kubelet's labels.

    Before the first sample only ``container_scrape_error 1`` is answered (a
    valid, empty scrape), as cAdvisor does when it cannot read containers.
    """
    out = _Exposition()
    if sample is None:
        out.family("container_scrape_error", "gauge", _SCRAPE_ERROR_HELP)
        out.sample("container_scrape_error", "", 1)
        return out.text()
    ts = round(sample.timestamp * 1000)
    rows = _cadvisor_series(sample)
    device = _labels([("device", sample.machine.image_fs_device)])
    for family in _CADVISOR_FAMILIES:
        if family.name > "container_scrape_error" and not out.has("container_scrape_error"):
            out.family("container_scrape_error", "gauge", _SCRAPE_ERROR_HELP)
            out.sample("container_scrape_error", "", 1 if sample.errors else 0)
        values = [(r, family.value(r, sample)) for r in rows
                  if r.sample is not None or not family.containers_only]
        if family.extra == "device" and all(v is None for _, v in values):
            continue  # the runtime reports no filesystem usage
        out.family(family.name, family.kind, family.help)
        for r, value in values:
            labels = r.labels
            if family.extra == "cpu":
                labels = r.labels_with_cpu
            elif family.extra == "device":
                labels = f"{r.labels},{device}"
            out.sample(family.name, labels, value, None if family.spec else ts)

    machine = _labels([("boot_id", sample.machine.boot_id),
                       ("machine_id", sample.machine.machine_id),
                       ("system_uuid", sample.machine.system_uuid)])
    out.family("machine_cpu_cores", "gauge", "Number of logical CPU cores.")
    out.sample("machine_cpu_cores", machine, sample.machine.num_cores)
    out.family("machine_memory_bytes", "gauge", "Amount of memory installed on the machine.")
    out.sample("machine_memory_bytes", machine, sample.machine.memory_capacity_bytes)
    return out.text()


def build_resource_metrics(sample: Sample | None) -> str:
    """``/metrics/resource``: the kubelet's resource metrics (metrics-server's source).

    Names, help texts (with their stability prefix) and labels are the Go
    kubelet's (metrics/collectors/resource_metrics.go); values carry the time of
    the sample. Before the first sample only the scrape error is answered.
    """
    out = _Exposition()
    if sample is not None:
        ts = round(sample.timestamp * 1000)
        _resource_figures(out, sample, ts)
    error = 1 if sample is None or sample.errors else 0
    out.family("resource_scrape_error", "gauge",
               "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise")
    out.sample("resource_scrape_error", "", error)
    out.family("scrape_error", "gauge",
               "[ALPHA] (Deprecated since 1.29.0) 1 if there was an error while getting "
               "container metrics, 0 otherwise")
    out.sample("scrape_error", "", error)
    return out.text()


def _resource_figures(out: _Exposition, sample: Sample, ts: int) -> None:
    containers = [(pod, c) for pod in sample.pods for c in pod.containers]

    def labels(pod: PodSample, c: ContainerSample | None) -> str:
        pairs = [("namespace", pod.namespace), ("pod", pod.name)]
        return _labels([("container", c.ref.name), *pairs] if c is not None else pairs)

    out.family("container_cpu_usage_seconds_total", "counter",
               "[STABLE] Cumulative cpu time consumed by the container in core-seconds")
    for pod, c in containers:
        out.sample("container_cpu_usage_seconds_total", labels(pod, c),
                   _seconds(c.figures.cpu_usage_ns), ts)
    out.family("container_memory_working_set_bytes", "gauge",
               "[STABLE] Current working set of the container in bytes")
    for pod, c in containers:
        out.sample("container_memory_working_set_bytes", labels(pod, c),
                   c.figures.memory_working_set_bytes, ts)
    out.family("container_start_time_seconds", "gauge",
               "[STABLE] Start time of the container since unix epoch in seconds")
    for pod, c in containers:
        if c.ref.created_at > 0:
            out.sample("container_start_time_seconds", labels(pod, c), c.ref.created_at)

    node = sample.node.figures
    out.family("node_cpu_usage_seconds_total", "counter",
               "[STABLE] Cumulative cpu time consumed by the node in core-seconds")
    out.sample("node_cpu_usage_seconds_total", "", _seconds(node.cpu_usage_ns), ts)
    out.family("node_memory_working_set_bytes", "gauge",
               "[STABLE] Current working set of the node in bytes")
    out.sample("node_memory_working_set_bytes", "", node.memory_working_set_bytes, ts)

    out.family("pod_cpu_usage_seconds_total", "counter",
               "[STABLE] Cumulative cpu time consumed by the pod in core-seconds")
    for pod in sample.pods:
        out.sample("pod_cpu_usage_seconds_total", labels(pod, None),
                   _seconds(pod.figures.cpu_usage_ns), ts)
    out.family("pod_memory_working_set_bytes", "gauge",
               "[STABLE] Current working set of the pod in bytes")
    for pod in sample.pods:
        out.sample("pod_memory_working_set_bytes", labels(pod, None),
                   pod.figures.memory_working_set_bytes, ts)

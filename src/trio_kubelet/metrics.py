"""The agent's own Prometheus metrics, named, labelled and bucketed as the Go kubelet's.

:class:`AgentMetrics` keeps its metrics in registries of its own (never the
process-global one), so several agents can live in one process (tests, the
simulator) and `/metrics` shows exactly this agent. :func:`render_text` writes a
registry in the Prometheus text format the way the Go kubelet does: counters
keep their Go names (``kubelet_evictions`` has no ``_total``) and the client
library's ``*_created`` series are left out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString as _untyped_float_to_go_string

from trio_kubelet.core.stats import escape_help, escape_label

__all__ = [
    "CONTENT_TYPE",
    "DEF_BUCKETS",
    "IMAGE_PULL_BUCKETS",
    "POD_STARTUP_BUCKETS",
    "RUNTIME_OPERATION_BUCKETS",
    "AgentMetrics",
    "exponential_buckets",
    "image_size_bucket",
    "operation_type",
    "render_text",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# prometheus.DefBuckets of the Go client (Python's default has three more).
DEF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# pkg/kubelet/metrics: podStartupDurationBuckets.
POD_STARTUP_BUCKETS = (
    0.5, 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900,
    1200, 1800, 2700, 3600,
)
# pkg/kubelet/metrics: imagePullDurationBuckets, and the image size label's lower bounds.
IMAGE_PULL_BUCKETS = (
    1, 5, 10, 20, 30, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)
_MIB, _GIB = 1 << 20, 1 << 30
_IMAGE_SIZE_BUCKETS = (
    (0, "0-10MB"), (10 * _MIB, "10MB-100MB"), (100 * _MIB, "100MB-500MB"),
    (500 * _MIB, "500MB-1GB"), (_GIB, "1GB-5GB"), (5 * _GIB, "5GB-10GB"),
    (10 * _GIB, "10GB-20GB"), (20 * _GIB, "20GB-30GB"), (30 * _GIB, "30GB-40GB"),
    (40 * _GIB, "40GB-60GB"), (60 * _GIB, "60GB-100GB"), (100 * _GIB, "GT100GB"),
)


def image_size_bucket(size: int) -> str:
    """The ``image_size_in_bytes`` label of an image pull: its size band, "N/A" if unknown."""
    if size <= 0:
        return "N/A"
    label = _IMAGE_SIZE_BUCKETS[0][1]
    for lower, name in _IMAGE_SIZE_BUCKETS:
        if size > lower:
            label = name
    return label


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """Go's ``prometheus.ExponentialBuckets``, multiplied step by step so the bounds print alike."""
    buckets = []
    for _ in range(count):
        buckets.append(start)
        start *= factor
    return tuple(buckets)


# metrics.ExponentialBuckets(.005, 2.5, 14) of runtime_operations_duration_seconds.
RUNTIME_OPERATION_BUCKETS = exponential_buckets(0.005, 2.5, 14)

# The Go kubelet's operation_type label where it is not the RPC name in snake case.
_OPERATION_TYPES = {"UpdateContainerResources": "update_container"}
_WORD_START = re.compile(r"(?<!^)(?=[A-Z])")

# Counters whose Go name has no "_total": the client library always adds one to the samples.
_UNSUFFIXED_COUNTERS = frozenset({"kubelet_evictions"})

# Go's float formatting in the text format ("+Inf", "1e+06", "0.005").
_float_to_go_string = cast(Callable[[float], str], _untyped_float_to_go_string)

# Path buckets of kubelet_http_requests_* that count as long-running (server.go).
LONG_RUNNING_PATHS = frozenset({"exec", "attach", "portForward", "debug"})


@lru_cache(maxsize=256)
def operation_type(method: str) -> str:
    """The Go kubelet's ``operation_type`` label for a CRI RPC: ``ListPodSandbox`` →
    ``list_podsandbox``, ``UpdateContainerResources`` → ``update_container``."""
    if method in _OPERATION_TYPES:
        return _OPERATION_TYPES[method]
    return _WORD_START.sub("_", method).lower().replace("pod_sandbox", "podsandbox")


class AgentMetrics:
    """Every metric the agent exports on ``/metrics`` and ``/metrics/probes``.

    The metric objects are public attributes for the code that owns each figure
    (the PLEG sets the relist metrics, the workers the pod worker duration, ...);
    the few helpers below cover the updates that need more than one call.
    """

    def __init__(self, node_name: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.probe_registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)

        self.node_name = Gauge("kubelet_node_name", "The node's name. The count is always 1.",
                               ["node"], registry=r)
        if node_name is not None:
            self.node_name.labels(node_name).set(1)
        self.running_pods = Gauge("kubelet_running_pods",
                                  "Number of pods that have a running pod sandbox", registry=r)
        self.running_containers = Gauge("kubelet_running_containers",
                                        "Number of containers currently running",
                                        ["container_state"], registry=r)
        self.pleg_relist_duration = Histogram(
            "kubelet_pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG.", buckets=DEF_BUCKETS, registry=r)
        self.pleg_relist_interval = Histogram(
            "kubelet_pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG.", buckets=DEF_BUCKETS, registry=r)
        self.pleg_last_seen = Gauge("kubelet_pleg_last_seen_seconds",
                                    "Timestamp in seconds when PLEG was last seen active.",
                                    registry=r)
        self.pod_start_sli_duration = Histogram(
            "kubelet_pod_start_sli_duration_seconds",
            "Duration in seconds to start a pod, excluding time to pull images and run init "
            "containers, measured from pod creation timestamp to when all its containers are "
            "reported as started and observed via watch",
            ["first_with_network"], buckets=POD_STARTUP_BUCKETS, registry=r)
        self.pod_worker_duration = Histogram(
            "kubelet_pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: create, "
            "update, or sync", ["operation_type"], buckets=DEF_BUCKETS, registry=r)
        self.runtime_operations = Counter(
            "kubelet_runtime_operations_total",
            "Cumulative number of runtime operations by operation type.",
            ["operation_type"], registry=r)
        self.runtime_operations_duration = Histogram(
            "kubelet_runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type.",
            ["operation_type"], buckets=RUNTIME_OPERATION_BUCKETS, registry=r)
        self.runtime_operations_errors = Counter(
            "kubelet_runtime_operations_errors_total",
            "Cumulative number of runtime operation errors by operation type.",
            ["operation_type"], registry=r)
        self.started_pods = Counter("kubelet_started_pods_total",
                                    "Cumulative number of pods started", registry=r)
        self.started_pods_errors = Counter("kubelet_started_pods_errors_total",
                                           "Cumulative number of errors when starting pods",
                                           registry=r)
        self.started_containers = Counter("kubelet_started_containers_total",
                                          "Cumulative number of containers started",
                                          ["container_type"], registry=r)
        self.started_containers_errors = Counter(
            "kubelet_started_containers_errors_total",
            "Cumulative number of errors when starting containers",
            ["container_type", "code"], registry=r)
        self.evictions = Counter("kubelet_evictions",
                                 "Cumulative number of pod evictions by eviction signal",
                                 ["eviction_signal"], registry=r)
        self.image_pull_duration = Histogram(
            "kubelet_image_pull_duration_seconds", "Duration in seconds to pull an image.",
            ["image_size_in_bytes"], buckets=IMAGE_PULL_BUCKETS, registry=r)
        self.image_garbage_collected = Counter(
            "kubelet_image_garbage_collected_total",
            "Total number of images garbage collected by the kubelet, whether through disk "
            "usage or image age.", ["reason"], registry=r)
        http_labels = ["method", "path", "server_type", "long_running"]
        self.http_requests = Counter(
            "kubelet_http_requests_total",
            "Number of the http requests received since the server started",
            http_labels, registry=r)
        self.http_requests_duration = Histogram(
            "kubelet_http_requests_duration_seconds", "Duration in seconds to serve http requests",
            http_labels, buckets=DEF_BUCKETS, registry=r)
        self.http_inflight_requests = Gauge("kubelet_http_inflight_requests",
                                            "Number of the inflight http requests",
                                            http_labels, registry=r)

        self.rest_client_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "host", "method"], registry=r)

        self.prober_probe_total = Counter(
            "prober_probe_total", "Cumulative number of a liveness, readiness or startup probe "
            "for a container by result.",
            ["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
            registry=self.probe_registry)
        self.prober_probe_duration = Histogram(
            "prober_probe_duration_seconds", "Duration in seconds for a probe response.",
            ["probe_type", "container", "pod", "namespace"], buckets=DEF_BUCKETS,
            registry=self.probe_registry)

    def api_observer(self, host: str, method: str, code: int | None) -> None:
        """An `apiserver.client.APIClient` observer: count requests as client-go does."""
        self.rest_client_requests.labels(str(code) if code else "<error>", host, method).inc()

    def cri_observer(self, method: str, request: Any, outcome: Any, duration: float) -> None:
        """A `runtime.client.Observer`: count and time every CRI call, and its errors."""
        op = operation_type(method)
        self.runtime_operations.labels(op).inc()
        self.runtime_operations_duration.labels(op).observe(duration)
        if isinstance(outcome, BaseException):
            self.runtime_operations_errors.labels(op).inc()

    def record_relist(self, *, duration: float, interval: float | None, wall_time: float,
                      running_pods: int, containers_by_state: Mapping[str, int]) -> None:
        """What one successful PLEG relist tells: its timing and the running pods/containers.

        ``containers_by_state`` uses the Go labels: created, running, exited, unknown.
        """
        self.pleg_relist_duration.observe(duration)
        if interval is not None:
            self.pleg_relist_interval.observe(interval)
        self.pleg_last_seen.set(wall_time)
        self.running_pods.set(running_pods)
        for state in ("created", "running", "exited", "unknown"):
            self.running_containers.labels(state).set(containers_by_state.get(state, 0))

    def render(self) -> bytes:
        return render_text(self.registry)

    def render_probes(self) -> bytes:
        return render_text(self.probe_registry)


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items()) + "}"


def _family_lines(family: Metric) -> Iterable[str]:
    typ = family.type if family.type in ("counter", "gauge", "histogram", "summary") else "untyped"
    name = family.name
    plain = typ == "counter" and name in _UNSUFFIXED_COUNTERS
    if typ == "counter" and not plain:
        name += "_total"
    created = family.name + "_created"
    yield f"# HELP {name} {escape_help(family.documentation)}"
    yield f"# TYPE {name} {typ}"
    for sample in family.samples:
        if sample.name == created:
            continue
        sample_name = family.name if plain else sample.name
        yield f"{sample_name}{_labels(sample.labels)} {_float_to_go_string(sample.value)}"


def render_text(registry: CollectorRegistry) -> bytes:
    """``registry`` in the Prometheus text format 0.0.4, as the Go kubelet writes it."""
    lines: list[str] = []
    for family in registry.collect():
        if not family.samples:
            continue
        lines.extend(_family_lines(family))
    return ("\n".join(lines) + "\n").encode() if lines else b""

"""Where a pod's cgroup sits in the QoS hierarchy (cgroupsPerQOS) and the limits it gets.

The rules are the Go kubelet's ``pkg/kubelet/cm``: Guaranteed pods live directly
under ``kubepods``, Burstable and BestEffort pods under ``kubepods/burstable``
and ``kubepods/besteffort``; a pod cgroup's limits are ``ResourceConfigForPod``,
the tiers' cpu shares ``qosContainerManager.setCPUCgroupConfig``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from trio_kubelet.core.qos import QOSClass, pod_qos_class
from trio_kubelet.model.pod import Container, Pod, is_sidecar
from trio_kubelet.model.quantity import is_quantity, parse_quantity

KUBEPODS = "kubepods"
POD_PREFIX = "pod"
QOS_CGROUPS: Mapping[QOSClass, tuple[str, ...]] = {
    "Guaranteed": (KUBEPODS,),
    "Burstable": (KUBEPODS, "burstable"),
    "BestEffort": (KUBEPODS, "besteffort"),
}

# The kernel's bounds for cpu.shares (v1) and cpu.weight (v2), and CFS bandwidth as the Go
# kubelet sets it.
MIN_SHARES = 2
MAX_SHARES = 262144
MAX_WEIGHT = 10000
SHARES_PER_CPU = 1024
CPU_PERIOD_US = 100_000
MIN_QUOTA_US = 1000
# What the Go kubelet writes to leave a QoS tier's huge pages effectively unlimited.
UNBOUNDED_HUGEPAGES = 1 << 62

_HUGEPAGES_PREFIX = "hugepages-"

Resources = dict[str, Fraction]


@dataclass(frozen=True, slots=True)
class CgroupConfig:
    """The settings to write to one cgroup; None leaves that setting as it is.

    ``cpu_quota`` is microseconds per ``cpu_period``, ``memory_limit`` bytes and
    ``pids_limit`` processes (``pids.max``).
    ``hugepage_limits`` maps a page size in bytes to a limit in bytes; page sizes
    the machine has but the mapping lacks get ``hugepage_default`` (the Go
    kubelet forbids huge pages a pod did not request).
    """

    cpu_shares: int | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None
    memory_limit: int | None = None
    pids_limit: int | None = None
    hugepage_limits: Mapping[int, int] | None = None
    hugepage_default: int = 0


def pod_cgroup_name(pod: Pod) -> tuple[str, ...]:
    """The pod cgroup's path components below the cgroup root, e.g. kubepods/burstable/pod<uid>."""
    uid = pod.metadata.uid
    # Go refuses "/" and "_" in a component ("_" would not survive the systemd driver's mapping).
    if not uid or "/" in uid or "_" in uid:
        raise ValueError(f"metadata.uid {uid!r} cannot name a pod cgroup")
    return (*QOS_CGROUPS[pod_qos_class(pod)], POD_PREFIX + uid)


def cgroup_path(name: Iterable[str], cgroup_root: str = "/") -> str:
    """A cgroup name in the cgroupfs driver's form: ``/`` + root + components."""
    parts = [p for p in cgroup_root.split("/") if p] + list(name)
    return "/" + "/".join(parts)


def cgroup_parent_for(pod: Pod, cgroup_root: str = "/") -> str:
    """The CRI ``LinuxPodSandboxConfig.cgroup_parent`` for the cgroupfs driver."""
    return cgroup_path(pod_cgroup_name(pod), cgroup_root)


def pod_uid_of(directory: str) -> str | None:
    """The pod uid a ``pod<uid>`` cgroup directory is named after; None for anything else."""
    if directory.startswith(POD_PREFIX) and len(directory) > len(POD_PREFIX):
        return directory[len(POD_PREFIX):]
    return None


def cpu_shares(cpu: Fraction) -> int:
    """cpu.shares for a number of CPUs, as Go's MilliCPUToShares (whole millicores, clamped)."""
    shares = _milli(cpu) * SHARES_PER_CPU // 1000
    return min(MAX_SHARES, max(MIN_SHARES, shares))


def cpu_weight(shares: int) -> int:
    """cgroup v2 cpu.weight for cpu.shares, as the Go kubelet's getCPUWeight converts them.

    Linear from [2, 262144] onto [1, 10000] (KEP-2254): 1024 shares (one CPU) is weight
    39. The Go kubelet writes the weight of pod and QoS cgroups itself with this formula;
    the newer curve through (1024, 100) in runc >= 1.3.2 and crun >= 1.23
    (ConvertCPUSharesToCgroupV2Value) is the OCI runtime's, for the containers it makes.
    """
    if shares >= MAX_SHARES:
        return MAX_WEIGHT
    return 1 + (shares - MIN_SHARES) * (MAX_WEIGHT - 1) // (MAX_SHARES - MIN_SHARES)


def cpu_quota(cpu: Fraction) -> int:
    """CFS quota per 100 ms period for a cpu limit, at least 1 ms (Go's MilliCPUToQuota)."""
    return max(MIN_QUOTA_US, _milli(cpu) * CPU_PERIOD_US // 1000)


def pod_resource_config(pod: Pod, *, pids_limit: int = -1) -> CgroupConfig:
    """The pod cgroup's limits (Go's ResourceConfigForPod, CFS quota enforced).

    Shares follow the summed requests. A Burstable pod gets a CFS quota only when
    every container declares a cpu limit, and a memory limit only when every one
    declares a memory limit; a partial sum would throttle the others. BestEffort
    gets the minimum shares. Every pod gets ``pids_limit`` (podPidsLimit) when it
    is positive. On cgroup v2 the same values are written as cpu.weight
    (`cpu_weight`), cpu.max, memory.max and pids.max; Go adds memory.min only under
    the MemoryQoS feature gate (alpha, off by default), which this agent lacks.
    """
    requests = pod_requests(pod)
    limits, every_cpu, every_memory = _pod_limits(pod)
    hugepages = _hugepage_limits(requests)
    pids = pids_limit if pids_limit > 0 else None
    qos = pod_qos_class(pod)
    if qos == "BestEffort":
        return CgroupConfig(cpu_shares=MIN_SHARES, pids_limit=pids, hugepage_limits=hugepages)
    shares = cpu_shares(requests.get("cpu", Fraction(0)))
    quota = cpu_quota(limits.get("cpu", Fraction(0)))
    memory = math.ceil(limits.get("memory", Fraction(0)))
    guaranteed = qos == "Guaranteed"
    return CgroupConfig(
        cpu_shares=shares,
        cpu_quota=quota if guaranteed or every_cpu else None,
        cpu_period=CPU_PERIOD_US if guaranteed or every_cpu else None,
        memory_limit=memory if guaranteed or every_memory else None,
        pids_limit=pids,
        hugepage_limits=hugepages,
    )


def qos_reserved_config(pods: Iterable[Pod]) -> dict[QOSClass, CgroupConfig]:
    """The Burstable and BestEffort tiers' settings for the node's active pods.

    Burstable shares are the Burstable pods' summed cpu requests, so the tier
    competes with Guaranteed pods (siblings under kubepods) in proportion;
    BestEffort always has the minimum. Huge pages stay unbounded on both. Memory
    reservation (Go's QOSReserved, off unless configured) is not done.
    """
    burstable = sum(
        (pod_requests(p).get("cpu", Fraction(0)) for p in pods if pod_qos_class(p) == "Burstable"),
        Fraction(0),
    )
    return {
        "Burstable": CgroupConfig(cpu_shares=cpu_shares(burstable), hugepage_limits={},
                                  hugepage_default=UNBOUNDED_HUGEPAGES),
        "BestEffort": CgroupConfig(cpu_shares=MIN_SHARES, hugepage_limits={},
                                   hugepage_default=UNBOUNDED_HUGEPAGES),
    }


def kubepods_config(allocatable: Mapping[str, str | int | float]) -> CgroupConfig:
    """``kubepods`` limited to a resource list (the node's capacity, or allocatable when enforced).

    As Go's getCgroupConfig: cpu as shares, memory as a limit, huge pages per size.
    """
    amounts = {name: parse_quantity(value) for name, value in allocatable.items()}
    return CgroupConfig(
        cpu_shares=cpu_shares(amounts["cpu"]) if "cpu" in amounts else None,
        memory_limit=math.ceil(amounts["memory"]) if "memory" in amounts else None,
        hugepage_limits=_hugepage_limits(amounts),
    )


def pod_requests(pod: Pod) -> Resources:
    """The pod's requests as the scheduler counts them, plus its runtime-class overhead."""
    total, _ = _effective(pod, _container_requests)
    for name, value in _overhead(pod).items():
        total[name] = total.get(name, Fraction(0)) + value
    return total


def pod_limits(pod: Pod) -> Resources:
    """The pod's limits (Go's PodLimits): only resources some container limits appear."""
    return _pod_limits(pod)[0]


def _pod_limits(pod: Pod) -> tuple[Resources, bool, bool]:
    """The pod's limits, and whether every container counted declares a cpu / memory limit."""
    total, weighed = _effective(pod, _container_limits)
    every_cpu = all(r.get("cpu", 0) > 0 for r in weighed)
    every_memory = all(r.get("memory", 0) > 0 for r in weighed)
    for name, value in _overhead(pod).items():
        if total.get(name, 0) > 0:  # overhead never turns "no limit" into a limit
            total[name] += value
    return total, every_cpu, every_memory


def _effective(
    pod: Pod, resources_of: Callable[[Container], Resources]
) -> tuple[Resources, list[Resources]]:
    """A pod total of per-container resources, and each container's share that was weighed.

    Regular containers and sidecars run together and add up. An init container
    runs beside the sidecars started before it; the pod needs the larger of
    that peak and the steady state (the sidecar KEP's formula).
    """
    total: Resources = {}
    weighed: list[Resources] = []
    for container in pod.spec.containers:
        own = resources_of(container)
        weighed.append(own)
        _add(total, own)
    sidecars: Resources = {}
    init_peak: Resources = {}
    for container in pod.spec.init_containers:
        own = resources_of(container)
        if is_sidecar(container):
            _add(total, own)
            _add(sidecars, own)
            running = dict(sidecars)
        else:
            running = dict(own)
            _add(running, sidecars)
        weighed.append(running)
        for name, value in running.items():
            init_peak[name] = max(init_peak.get(name, value), value)
    for name, value in init_peak.items():
        total[name] = max(total.get(name, value), value)
    return total, weighed


def _container_requests(container: Container) -> Resources:
    # A missing request defaults to the limit, as the API server's defaulting does.
    merged = {**container.resources.limits, **container.resources.requests}
    return {name: parse_quantity(value) for name, value in merged.items()}


def _container_limits(container: Container) -> Resources:
    return {name: parse_quantity(value) for name, value in container.resources.limits.items()}


def _overhead(pod: Pod) -> Resources:
    # spec.overhead (set by RuntimeClass admission) is not a typed field: it is kept as an extra.
    raw = (pod.spec.model_extra or {}).get("overhead") or {}
    return {name: parse_quantity(value) for name, value in raw.items()}


def _hugepage_limits(resources: Resources) -> dict[int, int]:
    """Page size in bytes → bytes, from ``hugepages-<size>`` entries."""
    limits: dict[int, int] = {}
    for name, value in resources.items():
        size_text = name.removeprefix(_HUGEPAGES_PREFIX)
        if size_text != name and is_quantity(size_text):
            size = math.ceil(parse_quantity(size_text))
            limits[size] = limits.get(size, 0) + math.ceil(value)
    return limits


def _add(total: Resources, more: Mapping[str, Fraction]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, Fraction(0)) + value


def _milli(cpu: Fraction) -> int:
    # Quantity.MilliValue rounds up to whole millicores.
    return math.ceil(cpu * 1000)

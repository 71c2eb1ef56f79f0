"""Eviction under resource pressure (the Go kubelet's eviction manager), as pure functions.

A round of the eviction manager is: turn a `Sample` into signal observations
(`observe`), see which thresholds are met and which node conditions follow, with
soft thresholds' grace periods, minimum reclaim and the pressure transition
period carried in an explicit `EvictionState` (`assess`), then rank the active
pods for the starved resource (`rank_pods`) and word the eviction
(`eviction_message`, `evicted_status`). No clock reads, no I/O: time and state go
in as arguments and come back out, so a round can be replayed or property-tested.

Apart from thresholds, a round evicts every pod past one of its own local storage
limits (`storage_usage`, `storage_overruns`): an emptyDir's sizeLimit, the pod's or a container's
ephemeral-storage limit.

A signal the sample cannot tell (an unreadable image filesystem, a memory figure
missing) has no observation, and a threshold without an observation is never met:
nothing is evicted on a guess.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Literal

from trio_kubelet.core.phase import MIRROR_ANNOTATION, is_static_pod
from trio_kubelet.core.pod_cgroups import pod_limits, pod_requests
from trio_kubelet.core.stats import FsUsage, PodSample, Sample, ephemeral_usage
from trio_kubelet.core.timestamps import format_time
from trio_kubelet.model.pod import Pod, PodCondition, PodStatus
from trio_kubelet.model.quantity import QuantityError, format_quantity, parse_quantity

MEMORY_AVAILABLE = "memory.available"
ALLOCATABLE_MEMORY_AVAILABLE = "allocatableMemory.available"
NODEFS_AVAILABLE = "nodefs.available"
NODEFS_INODES_FREE = "nodefs.inodesFree"
IMAGEFS_AVAILABLE = "imagefs.available"
IMAGEFS_INODES_FREE = "imagefs.inodesFree"
CONTAINERFS_AVAILABLE = "containerfs.available"
CONTAINERFS_INODES_FREE = "containerfs.inodesFree"
PID_AVAILABLE = "pid.available"

# Every signal, in the order a round considers them: memory first (Go ranks memory above
# every other resource), then the filesystems, then pids. Go's order among the others
# follows map iteration; a fixed one keeps rounds reproducible.
SIGNALS = (
    MEMORY_AVAILABLE,
    ALLOCATABLE_MEMORY_AVAILABLE,
    NODEFS_AVAILABLE,
    NODEFS_INODES_FREE,
    IMAGEFS_AVAILABLE,
    IMAGEFS_INODES_FREE,
    CONTAINERFS_AVAILABLE,
    CONTAINERFS_INODES_FREE,
    PID_AVAILABLE,
)
_SIGNAL_RANK = {signal: rank for rank, signal in enumerate(SIGNALS)}

MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
INODES = "inodes"
PIDS = "pids"
# The resource each signal is about: eviction messages name it, ranking measures it.
RESOURCE_OF: Mapping[str, str] = MappingProxyType({
    MEMORY_AVAILABLE: MEMORY,
    ALLOCATABLE_MEMORY_AVAILABLE: MEMORY,
    NODEFS_AVAILABLE: EPHEMERAL_STORAGE,
    NODEFS_INODES_FREE: INODES,
    IMAGEFS_AVAILABLE: EPHEMERAL_STORAGE,
    IMAGEFS_INODES_FREE: INODES,
    CONTAINERFS_AVAILABLE: EPHEMERAL_STORAGE,
    CONTAINERFS_INODES_FREE: INODES,
    PID_AVAILABLE: PIDS,
})

MEMORY_PRESSURE = "MemoryPressure"
DISK_PRESSURE = "DiskPressure"
PID_PRESSURE = "PIDPressure"
PRESSURE_CONDITIONS = (MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE)
CONDITION_OF: Mapping[str, str] = MappingProxyType({
    signal: MEMORY_PRESSURE if resource == MEMORY else PID_PRESSURE if resource == PIDS
    else DISK_PRESSURE
    for signal, resource in RESOURCE_OF.items()
})
# The signals about disk: the ones node-level reclaim (image and container GC) can relieve.
DISK_SIGNALS = frozenset(s for s, condition in CONDITION_OF.items() if condition == DISK_PRESSURE)

# The pod status reason and event reason of an eviction (and of an admission refusal
# under pressure), and the condition an evicted pod gets.
REASON_EVICTED = "Evicted"
DISRUPTION_TARGET = "DisruptionTarget"
TERMINATION_BY_KUBELET = "TerminationByKubelet"
# Node event when a round sets out to reclaim a resource.
REASON_THRESHOLD_MET = "EvictionThresholdMet"

# Pods at or above this priority (system-cluster-critical and system-node-critical) are
# critical: never evicted, always admitted.
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000
# A hard threshold evicts at once: this grace overrides the pod's (the 2 s floor still holds).
HARD_EVICTION_GRACE_SECONDS = 1
# How often the manager looks, and how long it waits for an evicted pod to go away.
MONITORING_INTERVAL = 10.0
POD_CLEANUP_TIMEOUT = 30.0
MEMORY_PRESSURE_TAINT = "node.kubernetes.io/memory-pressure"


class ThresholdError(ValueError):
    """An eviction setting that cannot be used; the message names the field and signal."""


# -- thresholds --------------------------------------------------------------------------------


def _float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


@dataclass(frozen=True, slots=True)
class ThresholdValue:
    """An amount ("100Mi") or a share of the signal's capacity ("10%", kept as Go's float32).

    ``binary`` records whether the amount was written with a power-of-two suffix, so a
    message prints it back as it was given.
    """

    quantity: Fraction | None = None
    percentage: float = 0.0
    binary: bool = True

    def amount(self, capacity: int) -> Fraction:
        """The amount this value stands for against ``capacity`` (truncated, as Go's)."""
        if self.quantity is not None:
            return self.quantity
        return Fraction(int(float(capacity) * self.percentage))

    def describe(self, capacity: int) -> str:
        return format_quantity(self.amount(capacity), binary=self.binary)


@dataclass(frozen=True, slots=True)
class Threshold:
    """``signal < value``; a grace period of 0 makes it hard (it acts on the first look)."""

    signal: str
    value: ThresholdValue
    grace_period: float = 0.0
    min_reclaim: ThresholdValue | None = None

    @property
    def hard(self) -> bool:
        return self.grace_period == 0


def parse_threshold_value(text: str, where: str) -> ThresholdValue | None:
    """"100Mi" or "10%"; None for "0%" and "100%", which Go takes as "no threshold"."""
    text = text.strip()
    if text.endswith("%"):
        if text in ("0%", "100%"):
            return None
        try:
            percent = float(text[:-1])
        except ValueError:
            raise ThresholdError(f"{where}: invalid percentage {text!r}") from None
        if not 0 < percent < 100:
            raise ThresholdError(f"{where}: percentage {text!r} must be between 0% and 100%")
        return ThresholdValue(percentage=_float32(_float32(percent) / 100))
    try:
        quantity = parse_quantity(text)
    except QuantityError as err:
        raise ThresholdError(f"{where}: {err}") from None
    if quantity <= 0:
        raise ThresholdError(f"{where}: must be positive (got {text!r})")
    return ThresholdValue(quantity=quantity, binary=text.endswith("i"))


def _min_reclaim(text: str, where: str) -> ThresholdValue | None:
    text = text.strip()
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise ThresholdError(f"{where}: invalid percentage {text!r}") from None
        if not 0 <= percent <= 100:
            raise ThresholdError(f"{where}: percentage {text!r} must be between 0% and 100%")
        return ThresholdValue(percentage=_float32(_float32(percent) / 100)) if percent else None
    try:
        quantity = parse_quantity(text)
    except QuantityError as err:
        raise ThresholdError(f"{where}: {err}") from None
    if quantity < 0:
        raise ThresholdError(f"{where}: must not be negative (got {text!r})")
    return ThresholdValue(quantity=quantity, binary=text.endswith("i")) if quantity else None


def _check_signal(signal: str, where: str) -> None:
    if signal not in RESOURCE_OF:
        raise ThresholdError(f"{where}[{signal}]: unknown eviction signal")


def parse_thresholds(
    hard: Mapping[str, str],
    soft: Mapping[str, str] = MappingProxyType({}),
    soft_grace_periods: Mapping[str, float] = MappingProxyType({}),
    minimum_reclaim: Mapping[str, str] = MappingProxyType({}),
    *,
    enforce_pods_allocatable: bool = False,
) -> tuple[Threshold, ...]:
    """The thresholds of evictionHard/Soft/SoftGracePeriod/MinimumReclaim, as Go builds them.

    Every soft threshold needs a grace period. With allocatable enforced for pods, a
    hard memory.available threshold also guards allocatableMemory.available.
    """
    reclaims: dict[str, ThresholdValue | None] = {}
    for signal, text in minimum_reclaim.items():
        _check_signal(signal, "evictionMinimumReclaim")
        reclaims[signal] = _min_reclaim(text, f"evictionMinimumReclaim[{signal}]")
    found: list[Threshold] = []
    for signal, text in hard.items():
        _check_signal(signal, "evictionHard")
        value = parse_threshold_value(text, f"evictionHard[{signal}]")
        if value is not None:
            found.append(Threshold(signal, value, 0.0, reclaims.get(signal)))
    for signal, text in soft.items():
        _check_signal(signal, "evictionSoft")
        value = parse_threshold_value(text, f"evictionSoft[{signal}]")
        if value is None:
            continue
        if signal not in soft_grace_periods:
            raise ThresholdError(
                f"evictionSoftGracePeriod[{signal}]: required for the soft eviction threshold"
            )
        grace = float(soft_grace_periods[signal])
        if grace < 0:
            raise ThresholdError(f"evictionSoftGracePeriod[{signal}]: must not be negative")
        found.append(Threshold(signal, value, grace, reclaims.get(signal)))
    if enforce_pods_allocatable:
        found.extend(
            Threshold(ALLOCATABLE_MEMORY_AVAILABLE, t.value, 0.0, t.min_reclaim)
            for t in list(found)
            if t.signal == MEMORY_AVAILABLE and t.hard
        )
    return tuple(sorted(found, key=_threshold_order))


def _threshold_order(threshold: Threshold) -> tuple[int, float]:
    return _SIGNAL_RANK[threshold.signal], threshold.grace_period


# -- observations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Observation:
    """One signal as a sample saw it: what is left, out of how much, and when (epoch s)."""

    available: int
    capacity: int
    time: float


def observe(sample: Sample, *, pods_memory_limit: int | None = None) -> dict[str, Observation]:
    """The signals a sample shows; a signal it cannot tell is left out.

    memory.available is the machine's memory less the root cgroup's working set (what
    cAdvisor and the Go summary report for the node; on cgroup v2 the root's usage is
    its memory.stat's anon + file, as runc computes it). allocatableMemory.available is
    ``pods_memory_limit`` (the kubepods limit) less the working set of the kubepods
    cgroup (Go's "pods" system container), or of the pods summed when that cgroup was
    not read; the container filesystem is the image filesystem (the writable layers
    live there).
    """
    t = sample.timestamp
    node = sample.node.reading
    found: dict[str, Observation] = {}
    capacity = sample.machine.memory_capacity_bytes
    working_set = node.figures.memory_working_set_bytes
    if working_set is not None and capacity > 0:
        found[MEMORY_AVAILABLE] = Observation(max(0, capacity - working_set), capacity, t)
    pods_used = _pods_working_set(sample)
    if pods_memory_limit is not None and pods_used is not None:
        found[ALLOCATABLE_MEMORY_AVAILABLE] = Observation(
            max(0, pods_memory_limit - pods_used), pods_memory_limit, t
        )
    filesystems = (
        (node.root_fs, NODEFS_AVAILABLE, NODEFS_INODES_FREE),
        (node.image_fs, IMAGEFS_AVAILABLE, IMAGEFS_INODES_FREE),
        (node.image_fs, CONTAINERFS_AVAILABLE, CONTAINERFS_INODES_FREE),
    )
    for fs, space, inodes in filesystems:
        if fs is None or fs.capacity_bytes <= 0:
            continue
        found[space] = Observation(fs.available_bytes, fs.capacity_bytes, t)
        if fs.inodes > 0:
            found[inodes] = Observation(fs.inodes_free, fs.inodes, t)
    if node.max_pid is not None and node.processes is not None:
        found[PID_AVAILABLE] = Observation(
            max(0, node.max_pid - node.processes), node.max_pid, t
        )
    return found


def _pods_working_set(sample: Sample) -> int | None:
    """The pods' working set: the kubepods cgroup's, else the pods' own summed."""
    pods = sample.node.reading.pods
    if pods is not None and pods.memory_working_set_bytes is not None:
        return pods.memory_working_set_bytes
    each = [p.figures.memory_working_set_bytes for p in sample.pods]
    if any(ws is None for ws in each):
        return None
    return sum(ws for ws in each if ws is not None)


def dedicated_image_fs(sample: Sample) -> bool:
    """Whether images live on a filesystem of their own (statvfs totals differ from nodefs's)."""
    root, image = sample.node.reading.root_fs, sample.node.reading.image_fs
    if root is None or image is None:
        return False
    return (root.capacity_bytes, root.inodes) != (image.capacity_bytes, image.inodes)


# -- the round ----------------------------------------------------------------------------------

_NO_TIMES: Mapping[Threshold, float] = MappingProxyType({})
_NO_CONDITION_TIMES: Mapping[str, float] = MappingProxyType({})
_NO_OBSERVATIONS: Mapping[str, Observation] = MappingProxyType({})


@dataclass(frozen=True)
class EvictionState:
    """What one round hands to the next.

    ``first_observed``: when each threshold now met was first seen met (soft grace);
    ``condition_seen``: when each pressure condition was last seen (transition period);
    ``met``: the thresholds acted on last round, kept met until minimum reclaim is done;
    ``observations``: last round's, to act only on fresh figures.
    """

    first_observed: Mapping[Threshold, float] = field(default_factory=lambda: _NO_TIMES)
    condition_seen: Mapping[str, float] = field(default_factory=lambda: _NO_CONDITION_TIMES)
    met: tuple[Threshold, ...] = ()
    observations: Mapping[str, Observation] = field(default_factory=lambda: _NO_OBSERVATIONS)


@dataclass(frozen=True)
class Assessment:
    """A round's verdict: the conditions to report and the thresholds to act on.

    ``actionable`` are met past their grace period with figures newer than last
    round's, most urgent first; the first one is the one to reclaim for.
    """

    state: EvictionState
    conditions: tuple[str, ...]
    actionable: tuple[Threshold, ...]

    @property
    def threshold(self) -> Threshold | None:
        return self.actionable[0] if self.actionable else None

    @property
    def resource(self) -> str | None:
        return RESOURCE_OF[self.actionable[0].signal] if self.actionable else None


def threshold_met(
    threshold: Threshold, observations: Mapping[str, Observation], *, min_reclaim: bool = False
) -> bool:
    """Whether the signal is below the threshold (plus the minimum reclaim, once acting)."""
    observed = observations.get(threshold.signal)
    if observed is None:
        return False
    amount = threshold.value.amount(observed.capacity)
    if min_reclaim and threshold.min_reclaim is not None:
        amount += threshold.min_reclaim.amount(observed.capacity)
    return amount > observed.available


def thresholds_met(
    thresholds: Iterable[Threshold],
    observations: Mapping[str, Observation],
    *,
    min_reclaim: bool = False,
) -> tuple[Threshold, ...]:
    return tuple(t for t in thresholds if threshold_met(t, observations, min_reclaim=min_reclaim))


def conditions_of(thresholds: Iterable[Threshold]) -> tuple[str, ...]:
    """The pressure conditions a set of thresholds stands for, in the node's order."""
    wanted = {CONDITION_OF[t.signal] for t in thresholds}
    return tuple(c for c in PRESSURE_CONDITIONS if c in wanted)


def assess(
    thresholds: Sequence[Threshold],
    observations: Mapping[str, Observation],
    state: EvictionState,
    *,
    now: float,
    transition_period: float,
) -> Assessment:
    """One round of Go's synchronize, up to the choice of what to reclaim.

    A condition stays reported for ``transition_period`` after its last sighting, so a
    node hovering at a threshold does not flap.
    """
    met = thresholds_met(thresholds, observations)
    unresolved = thresholds_met(state.met, observations, min_reclaim=True)
    met += tuple(t for t in unresolved if t not in met)
    first_observed = {t: state.first_observed.get(t, now) for t in met}
    condition_seen = dict(state.condition_seen)
    condition_seen.update(dict.fromkeys(conditions_of(met), now))
    conditions = tuple(
        c for c in PRESSURE_CONDITIONS
        if c in condition_seen and now - condition_seen[c] < transition_period
    )
    past_grace = tuple(t for t in met if now - first_observed[t] >= t.grace_period)
    fresh = tuple(t for t in past_grace if _updated(t.signal, observations, state.observations))
    new_state = EvictionState(
        first_observed=MappingProxyType(first_observed),
        condition_seen=MappingProxyType(condition_seen),
        met=past_grace,
        observations=MappingProxyType(dict(observations)),
    )
    return Assessment(new_state, conditions, tuple(sorted(fresh, key=_threshold_order)))


def _updated(
    signal: str, observations: Mapping[str, Observation], last: Mapping[str, Observation]
) -> bool:
    """Act only on a figure newer than the one already acted on (never twice on one sample)."""
    observed = observations.get(signal)
    if observed is None:
        return False
    previous = last.get(signal)
    return previous is None or observed.time > previous.time


def node_reclaim_applies(signal: str, *, dedicated_image_fs: bool) -> bool:
    """Whether image and container GC can relieve this signal before pods are evicted.

    Memory and pids have no node-level reclaim. With images on a filesystem of their
    own, nodefs pressure is left to pods (logs) and imagefs pressure goes to GC;
    otherwise both share the device and GC helps either.
    """
    if signal in (NODEFS_AVAILABLE, NODEFS_INODES_FREE):
        return not dedicated_image_fs
    return signal in (
        IMAGEFS_AVAILABLE, IMAGEFS_INODES_FREE, CONTAINERFS_AVAILABLE, CONTAINERFS_INODES_FREE
    )


# -- pods ---------------------------------------------------------------------------------------


def is_critical_pod(pod: Pod) -> bool:
    """Static and mirror pods and system-critical priorities: never evicted, always admitted."""
    return (
        is_static_pod(pod)
        or MIRROR_ANNOTATION in pod.metadata.annotations
        or (pod.spec.priority or 0) >= SYSTEM_CRITICAL_PRIORITY
    )


def tolerates_memory_pressure(pod: Pod) -> bool:
    """A toleration matching the node.kubernetes.io/memory-pressure:NoSchedule taint."""
    for toleration in (pod.spec.model_extra or {}).get("tolerations") or ():
        if not isinstance(toleration, Mapping):
            continue
        effect = toleration.get("effect") or ""
        if effect not in ("", "NoSchedule"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" and key in ("", MEMORY_PRESSURE_TAINT):
            return True
        if operator == "Equal" and key == MEMORY_PRESSURE_TAINT and not toleration.get("value"):
            return True
    return False


FsKind = Literal["rootfs", "logs"]


@dataclass(frozen=True, slots=True)
class PodUsage:
    """What one pod uses, as the ranking and the message measure it."""

    memory: int = 0  # the pod's working set (containers and sandbox)
    processes: int = 0
    rootfs_bytes: int = 0
    logs_bytes: int = 0
    rootfs_inodes: int = 0
    logs_inodes: int = 0
    container_memory: Mapping[str, int] = field(default_factory=dict)
    container_disk: Mapping[str, int] = field(default_factory=dict)  # writable layer + logs

    def disk(self, kinds: Collection[FsKind], *, inodes: bool) -> int:
        total = 0
        if "rootfs" in kinds:
            total += self.rootfs_inodes if inodes else self.rootfs_bytes
        if "logs" in kinds:
            total += self.logs_inodes if inodes else self.logs_bytes
        return total


def _pod_usage(pod: PodSample) -> PodUsage:
    memory: dict[str, int] = {}
    disk: dict[str, int] = {}
    sums = [0, 0, 0, 0]
    for c in pod.containers:
        if c.figures.memory_working_set_bytes is not None:
            memory[c.ref.name] = c.figures.memory_working_set_bytes
        rootfs, logs = c.rootfs, c.logs
        if rootfs is not None and rootfs.used_bytes is not None and logs is not None \
                and logs.used_bytes is not None:
            disk[c.ref.name] = rootfs.used_bytes + logs.used_bytes
        for index, usage in enumerate((rootfs, logs)):
            if usage is not None:
                sums[index] += usage.used_bytes or 0
                sums[index + 2] += usage.inodes_used or 0
    return PodUsage(
        memory=pod.figures.memory_working_set_bytes or 0,
        processes=pod.figures.threads or 0,
        rootfs_bytes=sums[0],
        logs_bytes=sums[1],
        rootfs_inodes=sums[2],
        logs_inodes=sums[3],
        container_memory=memory,
        container_disk=disk,
    )


def pod_usage(sample: Sample) -> dict[str, PodUsage]:
    """Each pod's usage by UID; a pod the sample did not see has no entry."""
    return {pod.uid: _pod_usage(pod) for pod in sample.pods}


def fs_kinds(signal: str, *, dedicated_image_fs: bool) -> tuple[FsKind, ...]:
    """What of a pod's disk use counts for a filesystem signal (Go's fsStatsToMeasure)."""
    if not dedicated_image_fs:
        return ("rootfs", "logs")
    if signal in (NODEFS_AVAILABLE, NODEFS_INODES_FREE):
        return ("logs",)
    return ("rootfs",)


def _request(pod: Pod, resource: str) -> Fraction:
    try:
        return pod_requests(pod).get(resource, Fraction(0))
    except QuantityError:
        return Fraction(0)


def _priority(pod: Pod) -> int:
    return pod.spec.priority or 0


def rank_pods(
    signal: str,
    pods: Sequence[Pod],
    usage: Mapping[str, PodUsage],
    *,
    dedicated_image_fs: bool = False,
) -> list[Pod]:
    """``pods`` in eviction order for a starved signal, first to go first.

    Memory and disk: pods without figures first (nothing shows they behave), then
    those using more than they requested, then lower priority, then the larger use
    beyond the request. Pids: lower priority, then more processes. Ties keep the
    given order.
    """
    resource = RESOURCE_OF[signal]

    def key(pod: Pod) -> tuple[int, int, int, Fraction]:
        used = usage.get(pod.metadata.uid)
        if resource == PIDS:
            if used is None:
                return (_priority(pod), 0, 0, Fraction(0))
            return (_priority(pod), 1, -used.processes, Fraction(0))
        if used is None:
            return (0, 0, _priority(pod), Fraction(0))
        if resource == MEMORY:
            amount, request = Fraction(used.memory), _request(pod, MEMORY)
        else:
            inodes = resource == INODES
            kinds = fs_kinds(signal, dedicated_image_fs=dedicated_image_fs)
            amount = Fraction(used.disk(kinds, inodes=inodes))
            request = Fraction(0) if inodes else _request(pod, EPHEMERAL_STORAGE)
        exceeds = amount > request
        return (1, 0 if exceeds else 1, _priority(pod), request - amount)

    return sorted(pods, key=key)


@dataclass(frozen=True, slots=True)
class Victim:
    """The pod a round evicts, why (the status message) and with what grace."""

    pod: Pod
    message: str
    grace: int


def choose_victim(
    threshold: Threshold,
    actionable: Sequence[Threshold],
    observations: Mapping[str, Observation],
    pods: Sequence[Pod],
    usage: Mapping[str, PodUsage],
    *,
    dedicated_image_fs: bool,
    max_pod_grace_period: int,
    refused: Collection[str] = (),
) -> Victim | None:
    """The first pod in eviction order that may go: not critical, and not one whose worker
    ``refused`` the eviction (gone or finished meanwhile); None when no pod may."""
    resource = RESOURCE_OF[threshold.signal]
    ranked = rank_pods(threshold.signal, pods, usage, dedicated_image_fs=dedicated_image_fs)
    for pod in ranked:
        uid = pod.metadata.uid
        if is_critical_pod(pod) or uid in refused:
            continue
        message = eviction_message(resource, pod, usage.get(uid), actionable, observations)
        return Victim(pod, message, eviction_grace(threshold, pod, max_pod_grace_period))
    return None


def eviction_grace(threshold: Threshold, pod: Pod, max_pod_grace_period: int) -> int:
    """The grace period the eviction kills with: 1 s for a hard threshold, else the smaller
    of evictionMaxPodGracePeriod and the pod's own."""
    if threshold.hard:
        return HARD_EVICTION_GRACE_SECONDS
    return min(max_pod_grace_period, pod.spec.termination_grace_period_seconds)


def _format_request(value: str | int | float | None) -> str:
    if value is None:
        return "0"
    try:
        amount = parse_quantity(value)
    except QuantityError:
        return str(value)
    return _format_like(amount, value)


def _format_like(amount: Fraction | int, written: str | int | float) -> str:
    """``amount`` in the notation ``written`` used (binary suffixes or not), as Go's
    Quantity.String() keeps a quantity's format."""
    binary = isinstance(written, str) and written.strip().endswith("i")
    return format_quantity(amount, binary=binary)


def eviction_message(
    resource: str,
    pod: Pod,
    usage: PodUsage | None,
    thresholds: Sequence[Threshold],
    observations: Mapping[str, Observation],
) -> str:
    """Why the pod was evicted: the starved resource, the threshold and what was left, and
    each container that used more than it requested (memory and disk)."""
    message = f"The node was low on resource: {resource}. "
    for threshold in thresholds:
        observed = observations.get(threshold.signal)
        if RESOURCE_OF[threshold.signal] == resource and observed is not None:
            message += (
                f"Threshold quantity: {threshold.value.describe(observed.capacity)}, "
                f"available: {format_quantity(observed.available, binary=True)}. "
            )
            break
    if usage is None or resource not in (MEMORY, EPHEMERAL_STORAGE):
        return message
    used_by = usage.container_memory if resource == MEMORY else usage.container_disk
    for container in pod.spec.containers:
        used = used_by.get(container.name)
        if used is None:
            continue
        spec = container.resources
        raw = spec.requests.get(resource, spec.limits.get(resource))
        try:
            request = parse_quantity(raw) if raw is not None else Fraction(0)
        except QuantityError:
            request = Fraction(0)
        if used > request:
            message += (
                f"Container {container.name} was using {format_quantity(used, binary=True)}, "
                f"request is {_format_request(raw)}, has larger consumption of {resource}. "
            )
    return message


# -- local storage limits -----------------------------------------------------------------------

# What a local-storage eviction is counted as (the evictions metric's signal label).
EMPTYDIR_LIMIT = "emptydirfs.limit"
POD_EPHEMERAL_LIMIT = "ephemeralpodfs.limit"
CONTAINER_EPHEMERAL_LIMIT = "ephemeralcontainerfs.limit"


@dataclass(frozen=True, slots=True)
class StorageOverrun:
    """A pod past one of its own local storage limits: which kind, and the status message."""

    pod: Pod
    limit: str  # EMPTYDIR_LIMIT, POD_EPHEMERAL_LIMIT or CONTAINER_EPHEMERAL_LIMIT
    message: str


@dataclass(frozen=True, slots=True)
class StorageUsage:
    """What a pod's local storage limits are measured against, in bytes."""

    ephemeral: int = 0  # writable layers, logs and local ephemeral volumes (the summary's)
    volumes: Mapping[str, int] = field(default_factory=dict)  # the measured volumes by name
    # Container name -> [writable layer, logs].
    containers: Mapping[str, Sequence[int]] = field(default_factory=dict)


def has_storage_limits(pod: Pod) -> bool:
    """Whether the pod limits its local storage at all: most pods do not, and are not checked."""
    return any(v.empty_dir is not None and v.empty_dir.get("sizeLimit") is not None
               for v in pod.spec.volumes) or any(
        EPHEMERAL_STORAGE in c.resources.limits
        for c in (*pod.spec.containers, *pod.spec.init_containers))


def storage_usage(sample: Sample, uids: Collection[str]) -> dict[str, StorageUsage]:
    """The `StorageUsage` of the pods ``uids`` names, by UID (none for a pod the sample
    did not see). An emptyDir's figure is the volume walk's (once a minute), the rest
    the sampler's.
    """
    usage = {}
    for pod in sample.pods:
        if pod.uid not in uids:
            continue
        volumes = sample.volumes.get(pod.uid, ())
        usage[pod.uid] = StorageUsage(
            ephemeral=_used_bytes(ephemeral_usage(pod, volumes)),
            volumes={v.name: v.usage.used_bytes for v in volumes
                     if v.usage.used_bytes is not None},
            containers={c.ref.name: (_used_bytes(c.rootfs), _used_bytes(c.logs))
                        for c in pod.containers},
        )
    return usage


def storage_overruns(
    pods: Sequence[Pod], usage: Mapping[str, StorageUsage], *, dedicated_image_fs: bool
) -> list[StorageOverrun]:
    """The pods using more local storage than their spec allows (Go's localStorageEviction).

    Per pod, the first of: an emptyDir past its ``sizeLimit``; the pod's ephemeral storage
    past the sum of its containers' ``ephemeral-storage`` limits; a container's logs (and
    writable layer, unless images have their own filesystem) past its own limit. Critical
    pods and pods without figures are left out.
    """
    overruns = []
    for pod in pods:
        used = usage.get(pod.metadata.uid)
        if used is None or is_critical_pod(pod):
            continue
        found = (
            _empty_dir_overrun(pod, used)
            or _pod_ephemeral_overrun(pod, used)
            or _container_ephemeral_overrun(pod, used, dedicated_image_fs)
        )
        if found is not None:
            overruns.append(StorageOverrun(pod, *found))
    return overruns


def _quantity(value: object) -> Fraction | None:
    if not isinstance(value, (str, int, float)):
        return None
    try:
        return parse_quantity(value)
    except QuantityError:
        return None  # admission reports a malformed quantity; here it limits nothing


def _empty_dir_overrun(pod: Pod, used: StorageUsage) -> tuple[str, str] | None:
    for volume in pod.spec.volumes:
        if volume.empty_dir is None:
            continue
        written = volume.empty_dir.get("sizeLimit")
        limit = _quantity(written)
        volume_used = used.volumes.get(volume.name)
        if limit is None or limit <= 0 or volume_used is None or volume_used <= limit:
            continue
        assert isinstance(written, (str, int, float))
        return EMPTYDIR_LIMIT, (
            f'Usage of EmptyDir volume "{volume.name}" exceeds the limit '
            f'"{_format_like(limit, written)}". '
        )
    return None


def _pod_ephemeral_overrun(pod: Pod, used: StorageUsage) -> tuple[str, str] | None:
    try:
        limit = pod_limits(pod).get(EPHEMERAL_STORAGE)
    except QuantityError:
        return None
    if limit is None or used.ephemeral <= limit:
        return None
    written = next(
        c.resources.limits[EPHEMERAL_STORAGE]
        for c in (*pod.spec.containers, *pod.spec.init_containers)
        if EPHEMERAL_STORAGE in c.resources.limits
    )
    return POD_EPHEMERAL_LIMIT, (
        "Pod ephemeral local storage usage exceeds the total limit of containers "
        f"{_format_like(limit, written)}. "
    )


def _container_ephemeral_overrun(
    pod: Pod, used: StorageUsage, dedicated_image_fs: bool
) -> tuple[str, str] | None:
    for container in pod.spec.containers:
        written = container.resources.limits.get(EPHEMERAL_STORAGE)
        limit = _quantity(written)
        figures = used.containers.get(container.name)
        if written is None or not limit or figures is None:
            continue
        writable_layer, logs = figures
        # The writable layer counts only where it shares the node's filesystem.
        total = logs if dedicated_image_fs else logs + writable_layer
        if total > limit:
            return CONTAINER_EPHEMERAL_LIMIT, (
                f"Container {container.name} exceeded its local ephemeral storage limit "
                f'"{_format_like(limit, written)}". '
            )
    return None


def _used_bytes(usage: FsUsage | None) -> int:
    return 0 if usage is None or usage.used_bytes is None else usage.used_bytes


def evicted_status(
    status: PodStatus,
    message: str,
    now: float,
    reason: str = REASON_EVICTED,
    *,
    disruption: bool = True,
) -> PodStatus:
    """An evicted pod's status: Failed, reason Evicted, the message, a DisruptionTarget.

    A pod killed for a node shutdown ends the same way with reason Terminated; one past its
    active deadline with reason DeadlineExceeded and no DisruptionTarget (``disruption``).
    """
    if not disruption:
        return status.model_copy(update={"phase": "Failed", "reason": reason, "message": message})
    target = PodCondition(
        type=DISRUPTION_TARGET,
        status="True",
        reason=TERMINATION_BY_KUBELET,
        message=message,
        last_transition_time=format_time(now),
    )
    conditions = []
    for condition in status.conditions:
        if condition.type == DISRUPTION_TARGET:
            if condition.status == "True" and condition.message == message:
                target = condition  # keep the first transition time
            continue
        conditions.append(condition)
    conditions.append(target)
    return status.model_copy(update={
        "phase": "Failed", "reason": reason, "message": message, "conditions": conditions,
    })


def pressure_admission_message(conditions: Sequence[str]) -> str:
    """Why a new pod is refused while the node is under pressure."""
    return f"The node had condition: [{' '.join(conditions)}]. "


@dataclass(frozen=True, slots=True)
class Eviction:
    """The order a pod worker carries out: kill with ``grace``, end Failed with ``reason`` and
    ``message`` (an eviction, a node shutdown's kill, or a pod past its active deadline, which
    is no disruption)."""

    message: str
    grace: int
    reason: str = REASON_EVICTED
    disruption: bool = True

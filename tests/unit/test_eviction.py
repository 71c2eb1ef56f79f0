"""core.eviction: thresholds, signals, the round's state, pod ranking and the eviction's words."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from fractions import Fraction
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_kubelet.core.eviction import (
    ALLOCATABLE_MEMORY_AVAILABLE,
    CONTAINER_EPHEMERAL_LIMIT,
    DISK_PRESSURE,
    EMPTYDIR_LIMIT,
    HARD_EVICTION_GRACE_SECONDS,
    IMAGEFS_AVAILABLE,
    MEMORY_AVAILABLE,
    MEMORY_PRESSURE,
    NODEFS_AVAILABLE,
    NODEFS_INODES_FREE,
    PID_AVAILABLE,
    PID_PRESSURE,
    POD_EPHEMERAL_LIMIT,
    RESOURCE_OF,
    EvictionState,
    Observation,
    PodUsage,
    Threshold,
    ThresholdError,
    ThresholdValue,
    assess,
    dedicated_image_fs,
    evicted_status,
    eviction_grace,
    eviction_message,
    has_storage_limits,
    is_critical_pod,
    node_reclaim_applies,
    observe,
    parse_thresholds,
    pod_usage,
    rank_pods,
    storage_overruns,
    storage_usage,
    threshold_met,
    thresholds_met,
)
from trio_kubelet.core.pod_cgroups import pod_requests
from trio_kubelet.core.stats import (
    CgroupFigures,
    ContainerRef,
    ContainerSample,
    FsFigures,
    FsUsage,
    MachineInfo,
    NodeReading,
    NodeSample,
    PodSample,
    Sample,
    VolumeUsage,
)
from trio_kubelet.model.pod import Pod, PodCondition, PodStatus

MiB = 1 << 20
GiB = 1 << 30
T0 = 1_700_000_000.0
DEFAULT_HARD = {
    "memory.available": "100Mi",
    "nodefs.available": "10%",
    "nodefs.inodesFree": "5%",
    "imagefs.available": "15%",
}
HARD = parse_thresholds(DEFAULT_HARD)


# -- builders (shared with test_eviction_manager and the bench) ---------------------------------


def make_pod(
    name: str,
    *,
    memory_request: str | None = None,
    storage_request: str | None = None,
    priority: int | None = None,
    annotations: Mapping[str, str] | None = None,
    grace: int = 30,
    containers: Sequence[str] = ("main",),
) -> Pod:
    requests = {}
    if memory_request is not None:
        requests["memory"] = memory_request
    if storage_request is not None:
        requests["ephemeral-storage"] = storage_request
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace,
        "containers": [
            {"name": c, "image": "busybox:1.36", "resources": {"requests": requests}}
            for c in containers
        ],
    }
    if priority is not None:
        spec["priority"] = priority
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "annotations": dict(annotations or {})},
        "spec": spec,
    })


def pod_sample(
    uid: str,
    *,
    memory: Mapping[str, int] | None = None,
    rootfs: Mapping[str, int] | None = None,
    logs: Mapping[str, int] | None = None,
    threads: int | None = None,
    sandbox_memory: int = 0,
) -> PodSample:
    memory = dict(memory or {"main": 0})
    names = sorted({*memory, *(rootfs or {}), *(logs or {})})
    containers = []
    for name in names:
        ref = ContainerRef(id=f"{uid}-{name}", name=name, pod_uid=uid, pod_name=uid,
                           pod_namespace="default", image="busybox", created_at=T0,
                           cgroup="")
        used_rootfs = (rootfs or {}).get(name)
        used_logs = (logs or {}).get(name)
        containers.append(ContainerSample(
            ref=ref,
            figures=CgroupFigures(memory_working_set_bytes=memory.get(name)),
            rootfs=None if used_rootfs is None else FsUsage(used_rootfs, used_rootfs // 4096),
            logs=None if used_logs is None else FsUsage(used_logs, 1),
        ))
    total = sum(memory.values()) + sandbox_memory
    return PodSample(uid=uid, name=uid, namespace="default", start_time=T0,
                     figures=CgroupFigures(memory_working_set_bytes=total, threads=threads),
                     cpu_nano_cores=None, containers=tuple(containers))


def make_sample(
    *,
    time: float = T0,
    capacity: int = 4 * GiB,
    node_working_set: int | None = 1 * GiB,
    root_fs: FsFigures | None = None,
    image_fs: FsFigures | None = None,
    max_pid: int | None = 4_194_304,
    processes: int | None = 500,
    pods: Sequence[PodSample] = (),
    kubepods_working_set: int | None = None,
) -> Sample:
    root_fs = root_fs or FsFigures(capacity_bytes=100 * GiB, available_bytes=60 * GiB,
                                   used_bytes=40 * GiB, inodes=6_000_000, inodes_free=5_000_000)
    reading = NodeReading(
        figures=CgroupFigures(memory_working_set_bytes=node_working_set),
        root_fs=root_fs,
        image_fs=image_fs,
        max_pid=max_pid,
        processes=processes,
        pods=(None if kubepods_working_set is None
              else CgroupFigures(memory_working_set_bytes=kubepods_working_set)),
    )
    return Sample(timestamp=time, monotonic=time - T0,
                  machine=MachineInfo(num_cores=2, memory_capacity_bytes=capacity),
                  node=NodeSample(reading), pods=tuple(pods))


def memory_observation(available: int, time: float = T0, capacity: int = 4 * GiB) -> dict[
    str, Observation
]:
    return {MEMORY_AVAILABLE: Observation(available, capacity, time)}


# -- parsing ------------------------------------------------------------------------------------


def test_the_default_hard_thresholds_parse_memory_first() -> None:
    assert [t.signal for t in HARD] == [
        MEMORY_AVAILABLE, NODEFS_AVAILABLE, NODEFS_INODES_FREE, IMAGEFS_AVAILABLE,
    ]
    assert all(t.hard for t in HARD)
    memory = HARD[0].value
    assert memory.amount(4 * GiB) == 100 * MiB
    # 10% of 1000 bytes, through Go's float32 and truncated.
    assert HARD[1].value.amount(1000) == 100
    assert HARD[1].value.amount(12345) == 1234


def test_zero_and_hundred_percent_switch_a_signal_off() -> None:
    assert parse_thresholds({"nodefs.available": "0%", "imagefs.available": "100%"}) == ()


def test_a_soft_threshold_needs_its_grace_period() -> None:
    with pytest.raises(ThresholdError, match=r"evictionSoftGracePeriod\[memory.available\]"):
        parse_thresholds({}, {"memory.available": "1Gi"})
    (soft,) = parse_thresholds({}, {"memory.available": "1Gi"}, {"memory.available": 90.0})
    assert not soft.hard and soft.grace_period == 90.0


@pytest.mark.parametrize(
    ("hard", "error"),
    [
        ({"memory.available": "lots"}, r"evictionHard\[memory.available\]"),
        ({"memory.available": "0"}, "must be positive"),
        ({"nodefs.available": "120%"}, "between 0% and 100%"),
        ({"memory.free": "1Gi"}, "unknown eviction signal"),
    ],
)
def test_unusable_thresholds_name_their_field(hard: dict[str, str], error: str) -> None:
    with pytest.raises(ThresholdError, match=error):
        parse_thresholds(hard)


def test_minimum_reclaim_attaches_to_the_signal() -> None:
    (memory,) = parse_thresholds({"memory.available": "1Gi"}, minimum_reclaim={
        "memory.available": "500Mi"})
    assert memory.min_reclaim == ThresholdValue(quantity=Fraction(500 * MiB))
    with pytest.raises(ThresholdError, match=r"evictionMinimumReclaim\[memory.available\]"):
        parse_thresholds({"memory.available": "1Gi"}, minimum_reclaim={"memory.available": "x"})


def test_enforced_allocatable_guards_the_pods_memory_with_the_hard_memory_threshold() -> None:
    thresholds = parse_thresholds(DEFAULT_HARD, enforce_pods_allocatable=True)
    allocatable = [t for t in thresholds if t.signal == ALLOCATABLE_MEMORY_AVAILABLE]
    assert len(allocatable) == 1 and allocatable[0].value == HARD[0].value
    soft_only = parse_thresholds({}, {"memory.available": "1Gi"}, {"memory.available": 60.0},
                                 enforce_pods_allocatable=True)
    assert [t.signal for t in soft_only] == [MEMORY_AVAILABLE]


# -- observations -------------------------------------------------------------------------------


def test_memory_available_is_capacity_less_the_root_working_set() -> None:
    observed = observe(make_sample(capacity=4 * GiB, node_working_set=3 * GiB))
    assert observed[MEMORY_AVAILABLE] == Observation(1 * GiB, 4 * GiB, T0)


def test_what_the_sample_cannot_tell_is_not_observed() -> None:
    observed = observe(make_sample(node_working_set=None, image_fs=None, processes=None))
    assert MEMORY_AVAILABLE not in observed
    assert IMAGEFS_AVAILABLE not in observed and PID_AVAILABLE not in observed
    assert ALLOCATABLE_MEMORY_AVAILABLE not in observed  # no kubepods limit given
    assert observed[NODEFS_AVAILABLE].available == 60 * GiB
    assert observed[NODEFS_INODES_FREE] == Observation(5_000_000, 6_000_000, T0)


def test_allocatable_memory_is_the_kubepods_limit_less_the_pods() -> None:
    pods = [pod_sample("a", memory={"main": 300 * MiB}),
            pod_sample("b", memory={"main": 100 * MiB}, sandbox_memory=MiB)]
    observed = observe(make_sample(pods=pods), pods_memory_limit=2 * GiB)
    assert observed[ALLOCATABLE_MEMORY_AVAILABLE].available == 2 * GiB - 401 * MiB, "summed"
    # The kubepods cgroup's own working set, as Go's "pods" system container, when read:
    # it also holds what no listed container is charged for (a pod being torn down).
    sample = make_sample(pods=pods, kubepods_working_set=450 * MiB)
    observed = observe(sample, pods_memory_limit=2 * GiB)
    assert observed[ALLOCATABLE_MEMORY_AVAILABLE].available == 2 * GiB - 450 * MiB


def test_pids_available() -> None:
    observed = observe(make_sample(max_pid=32768, processes=768))
    assert observed[PID_AVAILABLE] == Observation(32000, 32768, T0)


def test_a_dedicated_image_filesystem_is_told_by_its_size() -> None:
    same = FsFigures(100, 50, 50, 10, 5)
    assert not dedicated_image_fs(make_sample(root_fs=same, image_fs=same))
    assert dedicated_image_fs(make_sample(root_fs=same, image_fs=FsFigures(200, 50, 150, 10, 5)))
    assert not node_reclaim_applies(MEMORY_AVAILABLE, dedicated_image_fs=False)
    assert node_reclaim_applies(NODEFS_AVAILABLE, dedicated_image_fs=False)
    assert not node_reclaim_applies(NODEFS_AVAILABLE, dedicated_image_fs=True)
    assert node_reclaim_applies(IMAGEFS_AVAILABLE, dedicated_image_fs=True)


# -- rounds -------------------------------------------------------------------------------------


def test_a_hard_threshold_acts_on_the_first_look() -> None:
    result = assess(HARD, memory_observation(50 * MiB), EvictionState(), now=T0,
                    transition_period=300)
    assert result.conditions == (MEMORY_PRESSURE,)
    assert result.threshold == HARD[0] and result.resource == "memory"


def test_no_pressure_no_action() -> None:
    result = assess(HARD, memory_observation(2 * GiB), EvictionState(), now=T0,
                    transition_period=300)
    assert result.conditions == () and result.threshold is None


def test_a_soft_threshold_reports_pressure_at_once_but_acts_after_its_grace() -> None:
    soft = parse_thresholds({}, {"memory.available": "1Gi"}, {"memory.available": 60.0})
    state = EvictionState()
    for second in range(0, 60, 10):
        result = assess(soft, memory_observation(500 * MiB, T0 + second), state,
                        now=T0 + second, transition_period=300)
        assert result.conditions == (MEMORY_PRESSURE,) and result.threshold is None
        state = result.state
    result = assess(soft, memory_observation(500 * MiB, T0 + 60), state, now=T0 + 60,
                    transition_period=300)
    assert result.threshold == soft[0]


def test_a_soft_threshold_that_clears_starts_its_grace_over() -> None:
    soft = parse_thresholds({}, {"memory.available": "1Gi"}, {"memory.available": 30.0})
    state = assess(soft, memory_observation(500 * MiB, T0), EvictionState(), now=T0,
                   transition_period=0).state
    state = assess(soft, memory_observation(2 * GiB, T0 + 20), state, now=T0 + 20,
                   transition_period=0).state
    result = assess(soft, memory_observation(500 * MiB, T0 + 40), state, now=T0 + 40,
                    transition_period=0)
    assert result.threshold is None  # first seen again at T0+40


def test_pressure_is_held_for_the_transition_period() -> None:
    state = assess(HARD, memory_observation(50 * MiB, T0), EvictionState(), now=T0,
                   transition_period=300).state
    later = assess(HARD, memory_observation(2 * GiB, T0 + 299), state, now=T0 + 299,
                   transition_period=300)
    assert later.conditions == (MEMORY_PRESSURE,) and later.threshold is None
    cleared = assess(HARD, memory_observation(2 * GiB, T0 + 300), later.state, now=T0 + 300,
                     transition_period=300)
    assert cleared.conditions == ()


def test_minimum_reclaim_keeps_acting_until_the_margin_is_back() -> None:
    thresholds = parse_thresholds({"memory.available": "100Mi"},
                                  minimum_reclaim={"memory.available": "400Mi"})
    state = assess(thresholds, memory_observation(50 * MiB, T0), EvictionState(), now=T0,
                   transition_period=1).state
    # Above the threshold, below threshold + minimum reclaim: still met.
    result = assess(thresholds, memory_observation(300 * MiB, T0 + 10), state, now=T0 + 10,
                    transition_period=1)
    assert result.threshold == thresholds[0] and result.conditions == (MEMORY_PRESSURE,)
    done = assess(thresholds, memory_observation(600 * MiB, T0 + 20), result.state,
                  now=T0 + 20, transition_period=1)
    assert done.threshold is None and done.conditions == ()
    # Without having acted, the margin does not count.
    fresh = assess(thresholds, memory_observation(300 * MiB, T0), EvictionState(), now=T0,
                   transition_period=1)
    assert fresh.threshold is None


def test_the_same_figures_are_never_acted_on_twice() -> None:
    first = assess(HARD, memory_observation(50 * MiB, T0), EvictionState(), now=T0,
                   transition_period=300)
    again = assess(HARD, memory_observation(50 * MiB, T0), first.state, now=T0 + 10,
                   transition_period=300)
    assert first.threshold is not None and again.threshold is None
    assert again.conditions == (MEMORY_PRESSURE,)


def test_an_unknown_signal_is_never_acted_on() -> None:
    # The image filesystem could not be read: its threshold cannot be met.
    sample = make_sample(image_fs=None)
    result = assess(HARD, observe(sample), EvictionState(), now=T0, transition_period=300)
    assert result.conditions == () and result.threshold is None


def test_memory_is_reclaimed_before_disk_and_disk_before_pids() -> None:
    thresholds = parse_thresholds({"pid.available": "10%", "nodefs.available": "10%",
                                   "memory.available": "1Gi"})
    observed = {
        PID_AVAILABLE: Observation(10, 1000, T0),
        NODEFS_AVAILABLE: Observation(1, 100, T0),
        MEMORY_AVAILABLE: Observation(1, 4 * GiB, T0),
    }
    result = assess(thresholds, observed, EvictionState(), now=T0, transition_period=1)
    assert [t.signal for t in result.actionable] == [
        MEMORY_AVAILABLE, NODEFS_AVAILABLE, PID_AVAILABLE]
    assert result.conditions == (MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE)


# -- ranking ------------------------------------------------------------------------------------


def test_memory_ranking_puts_pods_beyond_their_requests_first() -> None:
    hog = make_pod("hog", memory_request="100Mi")
    good = make_pod("good", memory_request="1Gi")
    important_hog = make_pod("important", memory_request="10Mi", priority=1000)
    small_hog = make_pod("small", memory_request="100Mi")
    usage = pod_usage(make_sample(pods=[
        pod_sample("uid-hog", memory={"main": 900 * MiB}),
        pod_sample("uid-good", memory={"main": 800 * MiB}),
        pod_sample("uid-important", memory={"main": 2 * GiB}),
        pod_sample("uid-small", memory={"main": 200 * MiB}),
    ]))
    ranked = rank_pods(MEMORY_AVAILABLE, [good, important_hog, small_hog, hog], usage)
    assert [p.metadata.name for p in ranked] == ["hog", "small", "important", "good"]


def test_pods_without_figures_go_first() -> None:
    seen, unseen = make_pod("seen"), make_pod("unseen", memory_request="1Gi")
    usage = pod_usage(make_sample(pods=[pod_sample("uid-seen", memory={"main": 5 * GiB})]))
    assert rank_pods(MEMORY_AVAILABLE, [seen, unseen], usage)[0] is unseen


def test_disk_ranking_measures_writable_layers_and_logs() -> None:
    writer = make_pod("writer", storage_request="1Gi")
    logger = make_pod("logger")
    usage = pod_usage(make_sample(pods=[
        pod_sample("uid-writer", rootfs={"main": 900 * MiB}, logs={"main": 0}),
        pod_sample("uid-logger", rootfs={"main": 0}, logs={"main": 10 * MiB}),
    ]))
    # The logger has no request, so any use exceeds it; the writer stays within.
    assert rank_pods(NODEFS_AVAILABLE, [writer, logger], usage)[0] is logger
    # With images on their own filesystem, nodefs counts only logs, imagefs only layers.
    assert rank_pods(IMAGEFS_AVAILABLE, [logger, writer], usage,
                     dedicated_image_fs=True)[0] is logger  # both within request: layer use
    by_layers = rank_pods(IMAGEFS_AVAILABLE, [logger, writer],
                          {**usage, "uid-writer": PodUsage(rootfs_bytes=2 * GiB)},
                          dedicated_image_fs=True)
    assert by_layers[0] is writer


def test_pid_ranking_is_by_priority_then_processes() -> None:
    busy, calm, vip = make_pod("busy"), make_pod("calm"), make_pod("vip", priority=5)
    usage = pod_usage(make_sample(pods=[pod_sample("uid-busy", threads=900),
                                        pod_sample("uid-calm", threads=3),
                                        pod_sample("uid-vip", threads=5000)]))
    ranked = rank_pods(PID_AVAILABLE, [vip, calm, busy], usage)
    assert [p.metadata.name for p in ranked] == ["busy", "calm", "vip"]


def test_static_mirror_and_system_critical_pods_are_critical() -> None:
    assert is_critical_pod(make_pod("s", annotations={"kubernetes.io/config.source": "file"}))
    assert is_critical_pod(make_pod("m", annotations={"kubernetes.io/config.mirror": "x"}))
    assert is_critical_pod(make_pod("c", priority=2_000_000_000))
    assert not is_critical_pod(make_pod("a", annotations={"kubernetes.io/config.source": "api"}))
    assert not is_critical_pod(make_pod("p", priority=1_999_999_999))


def test_grace_is_immediate_for_hard_thresholds_and_capped_for_soft_ones() -> None:
    soft = Threshold(MEMORY_AVAILABLE, ThresholdValue(quantity=Fraction(GiB)), 60.0)
    pod = make_pod("a", grace=30)
    assert eviction_grace(HARD[0], pod, 120) == HARD_EVICTION_GRACE_SECONDS
    assert eviction_grace(soft, pod, 120) == 30
    assert eviction_grace(soft, pod, 10) == 10
    assert eviction_grace(soft, pod, 0) == 0


# -- words --------------------------------------------------------------------------------------


def test_the_message_names_the_signal_the_threshold_and_the_greedy_container() -> None:
    pod = make_pod("hog", memory_request="64Mi", containers=("hog", "side"))
    usage = pod_usage(make_sample(pods=[
        pod_sample("uid-hog", memory={"hog": 300 * MiB, "side": 10 * MiB})]))["uid-hog"]
    message = eviction_message("memory", pod, usage, HARD, memory_observation(50 * MiB))
    assert message == (
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        "Container hog was using 300Mi, request is 64Mi, has larger consumption of memory. "
    )


def test_a_percentage_threshold_is_shown_as_the_amount_it_stands_for() -> None:
    pod = make_pod("w")
    observed = {NODEFS_AVAILABLE: Observation(5 * GiB, 100 * GiB, T0)}
    usage = PodUsage(container_disk={"main": 3 * GiB})
    message = eviction_message("ephemeral-storage", pod, usage, HARD, observed)
    # 10% is Go's float32 0.1, a hair above a tenth: 10737418400 bytes, not 10Gi.
    assert message.startswith(
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10737418400, "
        "available: 5Gi. Container main was using 3Gi, request is 0, ")


def test_an_evicted_status_is_failed_with_the_reason_and_a_disruption_condition() -> None:
    before = PodStatus(phase="Running", conditions=[PodCondition(type="Ready", status="True")])
    status = evicted_status(before, "The node was low on resource: memory. ", T0)
    assert (status.phase, status.reason) == ("Failed", "Evicted")
    assert status.message == "The node was low on resource: memory. "
    disruption = status.conditions[-1]
    assert (disruption.type, disruption.status, disruption.reason) == (
        "DisruptionTarget", "True", "TerminationByKubelet")
    assert evicted_status(status, status.message or "", T0 + 60).conditions == status.conditions


# -- properties ---------------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None)

_requests = st.sampled_from([None, "0", "10Mi", "100Mi", "1Gi"])
_pods = st.lists(
    st.tuples(_requests, st.one_of(st.none(), st.integers(-10, 10)),
              st.one_of(st.none(), st.integers(0, 2 * GiB))),
    max_size=8,
)


# -- local storage limits -----------------------------------------------------------------------


def storage_pod(name: str, *, size_limit: str | None = None,
                limits: Mapping[str, str] | None = None,
                annotations: Mapping[str, str] | None = None) -> Pod:
    """A pod with an emptyDir "scratch" and containers ``limits`` names, each limited so."""
    scratch: dict[str, Any] = {} if size_limit is None else {"sizeLimit": size_limit}
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                     "annotations": dict(annotations or {})},
        "spec": {
            "volumes": [{"name": "scratch", "emptyDir": scratch}],
            "containers": [
                {"name": c, "image": "busybox",
                 "resources": {"limits": {"ephemeral-storage": limit}}}
                for c, limit in (limits or {}).items()
            ] or [{"name": "main", "image": "busybox"}],
        },
    })


def storage_sample(*pods: tuple[PodSample, int | None]) -> Sample:
    """Each pod with the bytes its "scratch" emptyDir holds (None: not measured yet)."""
    sample = make_sample(pods=[p for p, _ in pods])
    volumes = {p.uid: (VolumeUsage("scratch", FsUsage(used, 1), None, ephemeral=True),)
               for p, used in pods if used is not None}
    return dataclasses.replace(sample, volumes=volumes)


def overruns(pods: Sequence[Pod], sample: Sample, *, dedicated: bool = False) -> list[
    tuple[str, str, str]
]:
    return [(o.pod.metadata.name, o.limit, o.message)
            for o in storage_overruns(pods, storage_usage(sample, {p.metadata.uid for p in pods}),
                                     dedicated_image_fs=dedicated)]


def test_an_empty_dir_past_its_size_limit_evicts_its_pod() -> None:
    pods = [storage_pod("over", size_limit="1Mi"), storage_pod("under", size_limit="8Mi"),
            storage_pod("unlimited"), storage_pod("unmeasured", size_limit="1Mi")]
    sample = storage_sample((pod_sample("uid-over"), 3 * MiB), (pod_sample("uid-under"), 3 * MiB),
                            (pod_sample("uid-unlimited"), 3 * MiB),
                            (pod_sample("uid-unmeasured"), None))
    assert overruns(pods, sample) == [
        ("over", EMPTYDIR_LIMIT, 'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". ')]


def test_exactly_at_the_limit_is_within_it() -> None:
    pods = [storage_pod("full", size_limit="1Mi")]
    assert overruns(pods, storage_sample((pod_sample("uid-full"), MiB))) == []


def test_the_pod_limit_is_the_sum_of_its_containers_and_counts_its_volumes() -> None:
    # 2 MiB + 2 MiB of logs and writable layers, plus 3 MiB in the emptyDir: 7 MiB > 2Mi + 4Mi.
    pod = storage_pod("pod", limits={"a": "2Mi", "b": "4Mi"})
    figures = pod_sample("uid-pod", rootfs={"a": MiB, "b": MiB}, logs={"a": MiB, "b": MiB})
    assert overruns([pod], storage_sample((figures, 3 * MiB))) == [
        ("pod", POD_EPHEMERAL_LIMIT,
         "Pod ephemeral local storage usage exceeds the total limit of containers 6Mi. ")]
    assert overruns([pod], storage_sample((figures, 1 * MiB))) == []


def test_a_container_past_its_own_limit_evicts_its_pod() -> None:
    # 3 MiB for "a" is past its 2Mi; the pod as a whole (3 + 1 MiB) is within 2Mi + 8Mi.
    pod = storage_pod("pod", limits={"a": "2Mi", "b": "8Mi"})
    figures = pod_sample("uid-pod", rootfs={"a": 2 * MiB, "b": 0}, logs={"a": MiB, "b": MiB})
    assert overruns([pod], storage_sample((figures, None))) == [
        ("pod", CONTAINER_EPHEMERAL_LIMIT,
         'Container a exceeded its local ephemeral storage limit "2Mi". ')]
    # With images on a filesystem of their own, only the logs count against the limit.
    assert overruns([pod], storage_sample((figures, None)), dedicated=True) == []


def test_critical_pods_and_pods_without_figures_are_left_alone() -> None:
    static = storage_pod("static", size_limit="1Mi",
                         annotations={"kubernetes.io/config.source": "file"})
    unseen = storage_pod("unseen", size_limit="1Mi")
    sample = storage_sample((pod_sample("uid-static"), 3 * MiB))
    assert overruns([static, unseen], sample) == []


def test_only_pods_that_limit_their_storage_are_checked() -> None:
    assert has_storage_limits(storage_pod("sized", size_limit="1Mi"))
    assert has_storage_limits(storage_pod("limited", limits={"main": "1Gi"}))
    assert not has_storage_limits(storage_pod("free"))
    assert not has_storage_limits(make_pod("plain", storage_request="1Gi"))


def test_an_unparsable_size_limit_limits_nothing() -> None:
    pod = storage_pod("odd", size_limit="lots")
    assert overruns([pod], storage_sample((pod_sample("uid-odd"), 3 * MiB))) == []


def _ranked_setup(specs: list[tuple[str | None, int | None, int | None]]) -> tuple[
    list[Pod], dict[str, PodUsage]
]:
    pods, samples = [], []
    for index, (request, priority, used) in enumerate(specs):
        pod = make_pod(f"p{index}", memory_request=request, priority=priority)
        pods.append(pod)
        if used is not None:
            samples.append(pod_sample(pod.metadata.uid, memory={"main": used}))
    return pods, pod_usage(make_sample(pods=samples))


def _memory_class(pod: Pod, usage: Mapping[str, PodUsage]) -> tuple[int, int, int, Fraction]:
    """Go's memory order, restated: no figures, beyond request, priority, use above request."""
    used = usage.get(pod.metadata.uid)
    priority = pod.spec.priority or 0
    if used is None:
        return (0, 0, priority, Fraction(0))
    above = used.memory - pod_requests(pod).get("memory", Fraction(0))
    return (1, 0 if above > 0 else 1, priority, -above)


@PROPERTY_SETTINGS
@given(_pods)
def test_memory_ranking_is_a_permutation_in_gos_order(
    specs: list[tuple[str | None, int | None, int | None]],
) -> None:
    pods, usage = _ranked_setup(specs)
    ranked = rank_pods(MEMORY_AVAILABLE, pods, usage)
    assert sorted(p.metadata.uid for p in ranked) == sorted(p.metadata.uid for p in pods)
    for first, second in pairwise(ranked):
        assert _memory_class(first, usage) <= _memory_class(second, usage)


@PROPERTY_SETTINGS
@given(_pods)
def test_the_order_pods_come_in_only_breaks_ties(
    specs: list[tuple[str | None, int | None, int | None]],
) -> None:
    pods, usage = _ranked_setup(specs)
    forward = rank_pods(MEMORY_AVAILABLE, pods, usage)
    backward = rank_pods(MEMORY_AVAILABLE, list(reversed(pods)), usage)
    assert [_memory_class(p, usage) for p in forward] == [
        _memory_class(p, usage) for p in backward
    ]


_observed_memory = st.one_of(st.none(), st.integers(0, 4 * GiB))
_threshold_mib = st.integers(1, 2048)


@PROPERTY_SETTINGS
@given(_threshold_mib, st.integers(0, 1024), _observed_memory)
def test_a_threshold_is_met_exactly_when_less_is_available(
    threshold_mib: int, reclaim_mib: int, available: int | None
) -> None:
    (threshold,) = parse_thresholds(
        {"memory.available": f"{threshold_mib}Mi"},
        minimum_reclaim={"memory.available": f"{reclaim_mib}Mi"},
    )
    observed = {} if available is None else memory_observation(available)
    met = threshold_met(threshold, observed)
    assert met == (available is not None and available < threshold_mib * MiB)
    # Minimum reclaim only widens the band.
    assert not met or threshold_met(threshold, observed, min_reclaim=True)


_rounds = st.lists(st.tuples(st.integers(1, 30), _observed_memory), min_size=1, max_size=25)


@PROPERTY_SETTINGS
@given(
    _rounds,
    st.sampled_from([0.0, 20.0, 60.0]),
    st.sampled_from([0.0, 30.0, 300.0]),
)
def test_rounds_act_only_on_fresh_met_thresholds_and_report_what_they_see(
    rounds: list[tuple[int, int | None]], grace: float, transition: float
) -> None:
    thresholds = parse_thresholds(
        {"memory.available": "1Gi"} if grace == 0 else {},
        {"memory.available": "1Gi"} if grace else {},
        {"memory.available": grace},
    )
    state, now, first_met = EvictionState(), T0, None
    for step, available in rounds:
        now += step
        observed = {} if available is None else memory_observation(available, time=now)
        result = assess(thresholds, observed, state, now=now, transition_period=transition)
        met_now = bool(thresholds_met(thresholds, observed))
        first_met = (first_met if first_met is not None else now) if met_now else None
        if met_now:
            assert MEMORY_PRESSURE in result.conditions or transition == 0
        if available is None:
            assert result.threshold is None  # never on a guess
        if result.threshold is not None:
            assert met_now or thresholds_met(state.met, observed, min_reclaim=True)
            assert result.resource == RESOURCE_OF[result.threshold.signal]
        if met_now and first_met is not None and now - first_met >= grace:
            assert result.threshold is not None
        if result.conditions == ():
            assert not met_now or transition == 0
        state = result.state

"""core.pod_cgroups: pod cgroup names, ResourceConfigForPod and the QoS tiers' shares."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_kubelet.core.pod_cgroups import (
    CPU_PERIOD_US,
    MAX_SHARES,
    MAX_WEIGHT,
    MIN_SHARES,
    UNBOUNDED_HUGEPAGES,
    CgroupConfig,
    cgroup_parent_for,
    cpu_weight,
    kubepods_config,
    pod_cgroup_name,
    pod_resource_config,
    pod_uid_of,
    qos_reserved_config,
)
from trio_kubelet.core.qos import pod_qos_class
from trio_kubelet.model.pod import Pod

UID = "0b3c1a2e-5d6f-4a7b-8c9d-0e1f2a3b4c5d"
Mi = 1 << 20


def container(name: str, requests: dict[str, Any] | None = None,
              limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox",
            "resources": {"requests": requests or {}, "limits": limits or {}}, **extra}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
        uid: str = UID, **spec: Any) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "p", "namespace": "default", "uid": uid},
        "spec": {"containers": list(containers), "initContainers": list(init), **spec},
    })


FULL = {"cpu": "500m", "memory": "128Mi"}
GUARANTEED = pod(container("a", FULL, FULL))
BURSTABLE = pod(container("a", {"cpu": "250m"}))
BEST_EFFORT = pod(container("a"))


@pytest.mark.parametrize("subject, want", [
    (GUARANTEED, ("kubepods", f"pod{UID}")),
    (BURSTABLE, ("kubepods", "burstable", f"pod{UID}")),
    (BEST_EFFORT, ("kubepods", "besteffort", f"pod{UID}")),
])
def test_pod_cgroup_name_by_qos(subject: Pod, want: tuple[str, ...]) -> None:
    assert pod_cgroup_name(subject) == want


@pytest.mark.parametrize("root, want", [
    ("/", f"/kubepods/burstable/pod{UID}"),
    ("", f"/kubepods/burstable/pod{UID}"),
    ("/custom/", f"/custom/kubepods/burstable/pod{UID}"),
    ("/a/b", f"/a/b/kubepods/burstable/pod{UID}"),
])
def test_cgroup_parent_is_the_cgroupfs_path_below_the_root(root: str, want: str) -> None:
    assert cgroup_parent_for(BURSTABLE, root) == want


@pytest.mark.parametrize("uid", ["", "a/b", "a_b"])
def test_a_uid_that_cannot_name_a_cgroup_is_refused(uid: str) -> None:
    with pytest.raises(ValueError, match=r"metadata\.uid"):
        pod_cgroup_name(pod(container("a"), uid=uid))


@pytest.mark.parametrize("name, want", [
    (f"pod{UID}", UID), ("pod", None), ("burstable", None), ("besteffort", None), ("xpod1", None),
])
def test_pod_uid_of_a_directory(name: str, want: str | None) -> None:
    assert pod_uid_of(name) == want


def test_guaranteed_gets_shares_quota_and_memory_limit() -> None:
    subject = pod(container("a", FULL, FULL), container("b", None, {"cpu": "1", "memory": "1Gi"}))
    assert pod_resource_config(subject) == CgroupConfig(
        cpu_shares=1536, cpu_quota=150_000, cpu_period=CPU_PERIOD_US,
        memory_limit=128 * Mi + 1024 * Mi, hugepage_limits={},
    )


def test_burstable_with_every_limit_declared_is_capped() -> None:
    subject = pod(container("a", {"cpu": "100m", "memory": "64Mi"}, FULL),
                  container("b", {"cpu": "100m"}, FULL))
    assert pod_resource_config(subject) == CgroupConfig(
        cpu_shares=204, cpu_quota=100_000, cpu_period=CPU_PERIOD_US,
        memory_limit=256 * Mi, hugepage_limits={},
    )


def test_burstable_without_a_limit_everywhere_gets_shares_only() -> None:
    subject = pod(container("a", {"cpu": "100m"}, {"cpu": "1"}),
                  container("b", {"memory": "64Mi"}, {"memory": "1Gi"}))
    assert pod_resource_config(subject) == CgroupConfig(cpu_shares=102, hugepage_limits={})


def test_burstable_with_only_memory_limits_everywhere_gets_a_memory_limit() -> None:
    subject = pod(container("a", {"cpu": "1"}, {"memory": "64Mi"}),
                  container("b", None, {"memory": "64Mi"}))
    got = pod_resource_config(subject)
    assert (got.cpu_shares, got.cpu_quota, got.memory_limit) == (1024, None, 128 * Mi)


def test_best_effort_gets_minimum_shares_and_nothing_else() -> None:
    assert pod_resource_config(BEST_EFFORT) == CgroupConfig(cpu_shares=2, hugepage_limits={})


def test_shares_and_quota_are_clamped() -> None:
    tiny = pod_resource_config(pod(container("a", {"cpu": "1m"}, {"cpu": "1m"})))
    assert (tiny.cpu_shares, tiny.cpu_quota) == (MIN_SHARES, 1000)
    huge = pod_resource_config(pod(container("a", {"cpu": "1000"}, {"cpu": "1000"})))
    assert huge.cpu_shares == MAX_SHARES


@pytest.mark.parametrize(("shares", "weight"), [
    (MIN_SHARES, 1),  # BestEffort
    (256, 10),  # 250m
    (512, 20),  # 500m
    (1024, 39),  # one CPU: well below v2's default weight of 100
    (8192, 313),  # 8 CPUs: the kubepods weight a Go kubelet on 16 cores, half reserved, sets
    (MAX_SHARES - 1, 9999),
    (MAX_SHARES, MAX_WEIGHT),
])
def test_cpu_weight_is_the_go_kubelet_s_linear_conversion(shares: int, weight: int) -> None:
    assert cpu_weight(shares) == weight


@given(st.integers(MIN_SHARES, MAX_SHARES), st.integers(MIN_SHARES, MAX_SHARES))
def test_cpu_weight_keeps_the_order_of_shares_within_its_range(a: int, b: int) -> None:
    assert 1 <= cpu_weight(a) <= MAX_WEIGHT
    if a <= b:
        assert cpu_weight(a) <= cpu_weight(b)


def test_sub_millicore_requests_round_up_like_milli_value() -> None:
    got = pod_resource_config(pod(container("a", {"cpu": "100.5m"})))
    assert got.cpu_shares == 101 * 1024 // 1000


def test_init_containers_count_as_the_larger_of_peak_and_steady_state() -> None:
    subject = pod(
        container("a", {"cpu": "200m", "memory": "64Mi"}, {"cpu": "200m", "memory": "64Mi"}),
        init=(container("i", {"cpu": "1", "memory": "32Mi"}, {"cpu": "1", "memory": "32Mi"}),),
    )
    got = pod_resource_config(subject)
    assert (got.cpu_shares, got.cpu_quota, got.memory_limit) == (1024, 100_000, 64 * Mi)


def test_sidecars_add_to_the_steady_state_and_to_later_init_containers() -> None:
    limits = {"cpu": "500m", "memory": "64Mi"}
    subject = pod(
        container("a", limits, limits),
        init=(container("side", limits, limits, restartPolicy="Always"),
              container("i", limits, limits)),
    )
    got = pod_resource_config(subject)
    assert (got.cpu_shares, got.cpu_quota, got.memory_limit) == (1024, 100_000, 128 * Mi)


def test_an_init_container_without_a_cpu_limit_removes_the_quota() -> None:
    subject = pod(container("a", {"cpu": "100m"}, {"cpu": "1"}),
                  init=(container("i", {"cpu": "100m"}),))
    assert pod_resource_config(subject).cpu_quota is None


def test_overhead_adds_to_requests_and_to_limits_that_exist() -> None:
    subject = pod(container("a", {"cpu": "250m"}, {"memory": "64Mi"}),
                  overhead={"cpu": "250m", "memory": "16Mi"})
    got = pod_resource_config(subject)
    assert (got.cpu_shares, got.memory_limit, got.cpu_quota) == (512, 80 * Mi, None)


def test_hugepage_requests_become_per_size_limits() -> None:
    subject = pod(container("a", {"hugepages-2Mi": "8Mi", "memory": "64Mi"},
                            {"hugepages-2Mi": "8Mi", "memory": "64Mi"}),
                  container("b", {"hugepages-2Mi": "2Mi", "hugepages-1Gi": "1Gi"},
                            {"hugepages-2Mi": "2Mi", "hugepages-1Gi": "1Gi"}))
    assert pod_resource_config(subject).hugepage_limits == {2 * Mi: 10 * Mi, 1 << 30: 1 << 30}


def test_qos_tiers_burstable_shares_follow_burstable_requests_only() -> None:
    pods = [BURSTABLE, pod(container("b", {"cpu": "1"}, {"cpu": "2"})), GUARANTEED, BEST_EFFORT]
    tiers = qos_reserved_config(pods)
    assert tiers["Burstable"] == CgroupConfig(
        cpu_shares=1280, hugepage_limits={}, hugepage_default=UNBOUNDED_HUGEPAGES)
    assert tiers["BestEffort"] == CgroupConfig(
        cpu_shares=2, hugepage_limits={}, hugepage_default=UNBOUNDED_HUGEPAGES)


def test_qos_tiers_without_pods_get_minimum_shares() -> None:
    tiers = qos_reserved_config([])
    assert (tiers["Burstable"].cpu_shares, tiers["BestEffort"].cpu_shares) == (2, 2)
    assert tiers["Burstable"].memory_limit is None  # no QOSReserved memory reservation


def test_kubepods_config_from_allocatable() -> None:
    got = kubepods_config({"cpu": "2", "memory": "4Gi", "pods": "110", "hugepages-2Mi": "0"})
    assert got == CgroupConfig(cpu_shares=2048, memory_limit=4 << 30,
                               hugepage_limits={2 * Mi: 0})


# -- properties ------------------------------------------------------------------------------

millicores = st.integers(min_value=0, max_value=8000)
mebibytes = st.integers(min_value=0, max_value=4096)


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for name, amounts, unit in (("cpu", millicores, "m"), ("memory", mebibytes, "Mi")):
        limit = draw(st.none() | amounts)
        if limit is not None:
            limits[name] = f"{limit}{unit}"
        request = draw(st.none() | st.integers(min_value=0, max_value=limit or 8000))
        if request is not None:
            requests[name] = f"{request}{unit}"
    return {"requests": requests, "limits": limits}


@st.composite
def pods(draw: st.DrawFn) -> Pod:
    regular = draw(st.lists(resources(), min_size=1, max_size=3))
    inits = draw(st.lists(st.tuples(resources(), st.booleans()), max_size=2))
    return pod(
        *(container(f"c{i}", r["requests"], r["limits"]) for i, r in enumerate(regular)),
        init=tuple(
            container(f"i{i}", r["requests"], r["limits"],
                      **({"restartPolicy": "Always"} if sidecar else {}))
            for i, (r, sidecar) in enumerate(inits)
        ),
    )


@given(pods())
def test_shares_stay_within_the_kernel_bounds(subject: Pod) -> None:
    shares = pod_resource_config(subject).cpu_shares
    assert shares is not None and MIN_SHARES <= shares <= MAX_SHARES


@given(pods())
def test_guaranteed_always_has_quota_period_and_memory_limit(subject: Pod) -> None:
    config = pod_resource_config(subject)
    if pod_qos_class(subject) == "Guaranteed":
        assert config.cpu_quota is not None and config.cpu_quota >= 1000
        assert config.cpu_period == CPU_PERIOD_US
        assert config.memory_limit is not None and config.memory_limit > 0


@given(pods())
def test_best_effort_is_only_ever_minimum_shares(subject: Pod) -> None:
    config = pod_resource_config(subject)
    if pod_qos_class(subject) == "BestEffort":
        assert config == CgroupConfig(cpu_shares=MIN_SHARES, hugepage_limits={})


@given(pods())
def test_quota_and_period_come_together(subject: Pod) -> None:
    config = pod_resource_config(subject)
    assert (config.cpu_quota is None) == (config.cpu_period is None)


@given(pods())
def test_the_pod_cgroup_sits_under_its_qos_tier(subject: Pod) -> None:
    name = pod_cgroup_name(subject)
    tier = {"Guaranteed": (), "Burstable": ("burstable",), "BestEffort": ("besteffort",)}
    assert name == ("kubepods", *tier[pod_qos_class(subject)], f"pod{UID}")
    assert cgroup_parent_for(subject, "/") == "/" + "/".join(name)


@given(st.lists(pods(), max_size=5), pods())
def test_burstable_shares_grow_only_with_burstable_pods(active: list[Pod], extra: Pod) -> None:
    before = qos_reserved_config(active)["Burstable"].cpu_shares
    after = qos_reserved_config([*active, extra])["Burstable"].cpu_shares
    assert before is not None and after is not None
    if pod_qos_class(extra) == "Burstable":
        assert after >= before
    else:
        assert after == before
    assert qos_reserved_config([*active, extra])["BestEffort"].cpu_shares == MIN_SHARES


def test_a_positive_pids_limit_applies_to_every_qos_class() -> None:
    for subject in (BEST_EFFORT, pod(container("a", {"cpu": "1"}, {"cpu": "1"}))):
        assert pod_resource_config(subject, pids_limit=64).pids_limit == 64
        assert pod_resource_config(subject, pids_limit=0).pids_limit is None
        assert pod_resource_config(subject).pids_limit is None

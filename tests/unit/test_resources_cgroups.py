"""resources.cgroups: the QoS hierarchy on fake cgroup v1 and v2 trees, and on the real one."""

from __future__ import annotations

import functools
import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from tests.cgroupfs_fake import FakeCgroup2fs, cgroupfs_rmdir
from trio_kubelet.core.pod_cgroups import kubepods_config
from trio_kubelet.model.pod import Pod
from trio_kubelet.resources.cgroupfs import CgroupMode, detect_mode
from trio_kubelet.resources.cgroups import REQUIRED, CgroupError, QOSCgroups

UID = "6f1e0c2a-7b3d-4e5f-8a9b-0c1d2e3f4a5b"
Mi = 1 << 20
CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "freezer", "devices",
               "hugetlb", "systemd")
CREATED = tuple(c for c in CONTROLLERS if c != "devices")
HUGETLB_FILES = ("hugetlb.2MB.limit_in_bytes", "hugetlb.1GB.limit_in_bytes")


def make_pod(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
             uid: str = UID) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "p", "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "a", "image": "busybox", "resources": {
            "limits": limits or {}, "requests": requests or {}}}]},
    })


GUARANTEED = make_pod({"cpu": "500m", "memory": "128Mi"})
BURSTABLE = make_pod(requests={"cpu": "250m"})
BEST_EFFORT = make_pod()


class FakeCgroupfs:
    """Controller directories like /sys/fs/cgroup's, with just the root files the shell reads."""

    def __init__(self, base: Path) -> None:
        self.root = base
        for controller in CONTROLLERS:
            (base / controller).mkdir()
        (base / "cpuset" / "cpuset.cpus").write_text("0-3\n")
        (base / "cpuset" / "cpuset.mems").write_text("0\n")
        for name in HUGETLB_FILES:
            (base / "hugetlb" / name).write_text("9223372036854771712\n")

    def read(self, controller: str, cgroup: str, file: str) -> str:
        return (self.root / controller / cgroup.strip("/") / file).read_text().strip()

    def exists(self, controller: str, cgroup: str) -> bool:
        return (self.root / controller / cgroup.strip("/")).is_dir()


@pytest.fixture
def fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCgroupfs:
    monkeypatch.setattr(os, "rmdir", functools.partial(cgroupfs_rmdir, os.rmdir))
    return FakeCgroupfs(tmp_path)


async def test_start_creates_kubepods_and_tiers_in_every_hierarchy_but_devices(
    fs: FakeCgroupfs,
) -> None:
    await QOSCgroups(fs.root).start()
    for cgroup in ("kubepods", "kubepods/burstable", "kubepods/besteffort"):
        assert all(fs.exists(c, cgroup) for c in CREATED)
        assert not fs.exists("devices", cgroup)
        assert fs.read("cpuset", cgroup, "cpuset.cpus") == "0-3"
        assert fs.read("cpuset", cgroup, "cpuset.mems") == "0"
    for tier in ("kubepods/burstable", "kubepods/besteffort"):
        assert fs.read("cpu", tier, "cpu.shares") == "2"
        assert all(fs.read("hugetlb", tier, f) == str(1 << 62) for f in HUGETLB_FILES)


async def test_start_sets_burstable_shares_for_the_active_pods(fs: FakeCgroupfs) -> None:
    await QOSCgroups(fs.root).start([BURSTABLE, GUARANTEED, BEST_EFFORT])
    assert fs.read("cpu", "kubepods/burstable", "cpu.shares") == "256"
    assert fs.read("cpu", "kubepods/besteffort", "cpu.shares") == "2"


async def test_start_applies_the_kubepods_setting(fs: FakeCgroupfs) -> None:
    kubepods = kubepods_config({"cpu": "2", "memory": "3Gi", "hugepages-2Mi": "64Mi"})
    await QOSCgroups(fs.root, kubepods=kubepods).start()
    assert fs.read("cpu", "kubepods", "cpu.shares") == "2048"
    assert fs.read("memory", "kubepods", "memory.limit_in_bytes") == str(3 << 30)
    assert fs.read("hugetlb", "kubepods", "hugetlb.2MB.limit_in_bytes") == str(64 * Mi)
    assert fs.read("hugetlb", "kubepods", "hugetlb.1GB.limit_in_bytes") == "0"


async def test_start_below_a_custom_cgroup_root(fs: FakeCgroupfs) -> None:
    for controller in REQUIRED:
        (fs.root / controller / "custom").mkdir()
    cgroups = QOSCgroups(fs.root, "/custom")
    await cgroups.start()
    assert all(fs.exists(c, "custom/kubepods/besteffort") for c in CREATED)
    # An empty cpuset ancestor is filled in too, or nothing below it could run.
    assert fs.read("cpuset", "custom", "cpuset.cpus") == "0-3"
    assert cgroups.cgroup_parent(BURSTABLE) == f"/custom/kubepods/burstable/pod{UID}"


async def test_start_refuses_a_missing_cgroup_root(fs: FakeCgroupfs) -> None:
    with pytest.raises(CgroupError, match="cgroup root '/nowhere' does not exist"):
        await QOSCgroups(fs.root, "/nowhere").start()


async def test_start_refuses_a_missing_required_controller(fs: FakeCgroupfs) -> None:
    os.rmdir(fs.root / "cpuset")
    with pytest.raises(CgroupError, match="'cpuset' is not mounted"):
        await QOSCgroups(fs.root).start()


@pytest.mark.parametrize("subject, cgroup", [
    (GUARANTEED, f"kubepods/pod{UID}"),
    (BURSTABLE, f"kubepods/burstable/pod{UID}"),
    (BEST_EFFORT, f"kubepods/besteffort/pod{UID}"),
])
async def test_ensure_pod_creates_the_pod_cgroup_under_its_tier(
    fs: FakeCgroupfs, subject: Pod, cgroup: str
) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(subject)
    assert all(fs.exists(c, cgroup) for c in CREATED)
    assert fs.read("cpuset", cgroup, "cpuset.cpus") == "0-3"
    assert cgroups.cgroup_parent(subject) == "/" + cgroup


async def test_a_guaranteed_pod_cgroup_gets_its_limits(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(GUARANTEED)
    cgroup = f"kubepods/pod{UID}"
    assert fs.read("cpu", cgroup, "cpu.shares") == "512"
    assert fs.read("cpu", cgroup, "cpu.cfs_period_us") == "100000"
    assert fs.read("cpu", cgroup, "cpu.cfs_quota_us") == "50000"
    assert fs.read("memory", cgroup, "memory.limit_in_bytes") == str(128 * Mi)
    # Huge pages the pod did not request are forbidden.
    assert all(fs.read("hugetlb", cgroup, f) == "0" for f in HUGETLB_FILES)


async def test_a_burstable_pod_without_limits_gets_shares_only(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(BURSTABLE)
    cgroup = fs.root / "cpu" / "kubepods" / "burstable" / f"pod{UID}"
    assert (cgroup / "cpu.shares").read_text() == "256"
    assert not (cgroup / "cpu.cfs_quota_us").exists()
    assert not (fs.root / "memory" / "kubepods" / "burstable" / f"pod{UID}" /
                "memory.limit_in_bytes").exists()


async def test_ensure_pod_leaves_an_existing_pod_cgroup_alone(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(GUARANTEED)
    (fs.root / "cpu" / "kubepods" / f"pod{UID}" / "cpu.shares").write_text("777")
    await cgroups.ensure_pod(GUARANTEED)
    assert fs.read("cpu", f"kubepods/pod{UID}", "cpu.shares") == "777"


async def test_update_qos_follows_the_burstable_requests(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    other = make_pod(requests={"cpu": "1"}, uid="other")
    await cgroups.update_qos([BURSTABLE, other])
    assert fs.read("cpu", "kubepods/burstable", "cpu.shares") == "1280"
    await cgroups.update_qos([GUARANTEED])
    assert fs.read("cpu", "kubepods/burstable", "cpu.shares") == "2"


async def test_update_qos_writes_only_a_change_but_the_periodic_pass_rewrites(
    fs: FakeCgroupfs,
) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start([BURSTABLE])
    (fs.root / "cpu" / "kubepods" / "burstable" / "cpu.shares").write_text("777")
    await cgroups.update_qos([BURSTABLE, GUARANTEED])  # the same shares: not written again
    assert fs.read("cpu", "kubepods/burstable", "cpu.shares") == "777"
    await cgroups.update_qos([BURSTABLE], rewrite=True)
    assert fs.read("cpu", "kubepods/burstable", "cpu.shares") == "256"


async def test_update_qos_before_start_fails_with_the_path(fs: FakeCgroupfs) -> None:
    with pytest.raises(CgroupError, match="kubepods/burstable"):
        await QOSCgroups(fs.root).update_qos([BURSTABLE])


async def test_repair_keeps_the_tiers_in_step_with_the_active_pods(fs: FakeCgroupfs) -> None:
    active = [GUARANTEED]
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    assert fs.read("cpu", "kubepods/burstable", "cpu.shares") == "2"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: cgroups.repair(lambda: list(active), interval=0.01))
        active.append(BURSTABLE)
        with trio.fail_after(5):
            while fs.read("cpu", "kubepods/burstable", "cpu.shares") != "256":
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


def runc_container_dirs(fs: FakeCgroupfs, pod_cgroup: str, container_id: str) -> None:
    """What runc leaves below a pod cgroup: a directory per container, devices included."""
    for controller in CONTROLLERS:
        (fs.root / controller / pod_cgroup / container_id).mkdir(parents=True)
        (fs.root / controller / pod_cgroup / container_id / "cgroup.procs").write_text("")


async def test_remove_pod_removes_every_hierarchy_and_container_cgroup(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(BURSTABLE)
    runc_container_dirs(fs, f"kubepods/burstable/pod{UID}", "c0ffee")
    await cgroups.remove_pod(UID)
    for controller in CONTROLLERS:
        assert not fs.exists(controller, f"kubepods/burstable/pod{UID}")
        assert controller == "devices" or fs.exists(controller, "kubepods/burstable")


async def test_remove_pod_without_cgroups_is_quiet(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.remove_pod("never-created")


async def test_remove_pod_kills_processes_left_in_it(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(BEST_EFFORT)
    leftover = subprocess.Popen(["sleep", "60"])
    try:
        runc_container_dirs(fs, f"kubepods/besteffort/pod{UID}", "c0ffee")
        procs = fs.root / "memory" / "kubepods" / "besteffort" / f"pod{UID}" / "c0ffee"
        procs.joinpath("cgroup.procs").write_text(f"{leftover.pid}\n")
        async with trio.open_nursery() as nursery:
            # The fake rmdir stays busy until the process has gone, as the kernel's would.
            nursery.start_soon(_empty_procs_when_dead, leftover, procs / "cgroup.procs")
            await cgroups.remove_pod(UID)
        assert leftover.returncode == -9
        assert not fs.exists("memory", f"kubepods/besteffort/pod{UID}")
    finally:
        leftover.kill()
        leftover.wait()


async def _empty_procs_when_dead(process: subprocess.Popen[bytes], procs: Path) -> None:
    while process.poll() is None:
        await trio.sleep(0.001)
    procs.write_text("")


async def test_remove_pod_gives_up_on_a_cgroup_that_stays_busy(
    fs: FakeCgroupfs, monkeypatch: pytest.MonkeyPatch
) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(GUARANTEED)
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    (fs.root / "cpu" / "kubepods" / f"pod{UID}" / "cgroup.procs").write_text("4242\n")
    with pytest.raises(CgroupError, match=f"cannot remove .*pod{UID}: Device or resource busy"):
        await cgroups.remove_pod(UID)
    assert killed == [4242]


async def test_orphans_are_pod_cgroups_no_known_pod_owns(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root)
    await cgroups.start()
    await cgroups.ensure_pod(GUARANTEED)
    await cgroups.ensure_pod(make_pod(requests={"cpu": "1"}, uid="burst"))
    # Left only in one hierarchy (runc's devices cgroup after a crash) still counts.
    (fs.root / "devices" / "kubepods" / "besteffort" / "podstray").mkdir(parents=True)
    (fs.root / "cpu" / "kubepods" / "not-a-pod").mkdir()
    assert await cgroups.orphans([UID]) == ["burst", "stray"]
    assert await cgroups.orphans([UID, "burst", "stray"]) == []


# -- the real hierarchy ----------------------------------------------------------------------

REAL_ROOT = Path("/sys/fs/cgroup")


def _cgroup_v1_as_root() -> bool:
    return os.geteuid() == 0 and all((REAL_ROOT / c / "cgroup.procs").exists() for c in REQUIRED)


def _remove_real(parent: str) -> None:
    for hierarchy in REAL_ROOT.iterdir():
        top = hierarchy / parent
        if top.is_dir():
            for directory, _, _ in os.walk(top, topdown=False):
                os.rmdir(directory)


@pytest.fixture
def real_parent() -> Iterator[str]:
    parent = f"trio-kubelet-test-{secrets.token_hex(4)}"
    try:
        for controller in REQUIRED:
            (REAL_ROOT / controller / parent).mkdir()
        yield parent
    finally:
        _remove_real(parent)


@pytest.mark.skipif(not _cgroup_v1_as_root(), reason="needs root on a cgroup v1 hierarchy")
async def test_a_real_pod_cgroup_is_created_joined_and_removed(real_parent: str) -> None:
    cgroups = QOSCgroups(REAL_ROOT, f"/{real_parent}")
    await cgroups.start([BURSTABLE])
    await cgroups.ensure_pod(GUARANTEED)
    pod_cgroup = f"{real_parent}/kubepods/pod{UID}"
    assert (REAL_ROOT / "cpu" / pod_cgroup / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (REAL_ROOT / "memory" / pod_cgroup / "memory.limit_in_bytes").read_text().strip() == (
        str(128 * Mi))
    assert (REAL_ROOT / "cpu" / real_parent / "kubepods" / "burstable" / "cpu.shares"
            ).read_text().strip() == "256"

    def join(pid: int) -> None:
        # Joining the cpuset proves it was given cpus and mems (an empty one refuses tasks).
        for controller in ("cpu", "cpuset", "memory"):
            (REAL_ROOT / controller / pod_cgroup / "cgroup.procs").write_text(str(pid))

    await _removed_with_its_process(cgroups, join)
    assert not any((h / pod_cgroup).exists() for h in REAL_ROOT.iterdir())


async def _removed_with_its_process(cgroups: QOSCgroups, join: Callable[[int], None]) -> None:
    """A process ``join``s the pod's cgroup; the pod cgroup, orphaned, is removed and the
    process killed."""
    leftover = subprocess.Popen(["sleep", "60"])
    try:
        join(leftover.pid)
        assert await cgroups.orphans([]) == [UID]
        await cgroups.remove_pod(UID)
        assert leftover.wait(timeout=5) == -9
    finally:
        leftover.kill()
        leftover.wait()
    assert await cgroups.orphans([]) == []


async def test_pod_pids_limit_becomes_pids_max_of_every_pod_cgroup(fs: FakeCgroupfs) -> None:
    cgroups = QOSCgroups(fs.root, pod_pids_limit=100)
    await cgroups.start()
    await cgroups.ensure_pod(BEST_EFFORT)
    assert fs.read("pids", f"kubepods/besteffort/pod{UID}", "pids.max") == "100"
    unlimited = QOSCgroups(fs.root)
    other = make_pod(uid="0b9c6f2e-1d2a-4c3b-9e8f-7a6b5c4d3e2f")
    await unlimited.ensure_pod(other)
    assert not (fs.root / "pids" / "kubepods" / "besteffort" / f"pod{other.metadata.uid}" /
                "pids.max").exists()


# -- cgroup v2 (the unified hierarchy) -------------------------------------------------------


@pytest.fixture
def fs2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCgroup2fs:
    fs = FakeCgroup2fs(tmp_path / "cgroup")
    fs.install(monkeypatch)
    return fs


async def test_v2_start_creates_kubepods_and_tiers_with_their_controllers(
    fs2: FakeCgroup2fs,
) -> None:
    cgroups = QOSCgroups(fs2.root)
    assert cgroups.mode is CgroupMode.V2
    await cgroups.start([BURSTABLE, GUARANTEED])
    # Each ancestor enables the controllers for the cgroups below it.
    for parent in ("/", "/kubepods"):
        assert {"cpu", "memory", "pids", "hugetlb"} <= fs2.enabled(parent)
    assert fs2.read("kubepods/burstable", "cpu.weight") == "10", "256 shares"
    assert fs2.read("kubepods/besteffort", "cpu.weight") == "1", "2 shares"
    for tier in ("kubepods/burstable", "kubepods/besteffort"):
        assert fs2.read(tier, "cpu.max") == "max 100000"
        assert fs2.read(tier, "hugetlb.2MB.max") == fs2.read(tier, "hugetlb.1GB.max") == str(
            1 << 62)
        assert fs2.read(tier, "hugetlb.2MB.rsvd.max") == str(1 << 62)


async def test_v2_start_applies_the_kubepods_setting(fs2: FakeCgroup2fs) -> None:
    kubepods = kubepods_config({"cpu": "2", "memory": "3Gi", "hugepages-2Mi": "64Mi"})
    await QOSCgroups(fs2.root, kubepods=kubepods).start()
    assert fs2.read("kubepods", "cpu.weight") == "79", "2048 shares"
    assert fs2.read("kubepods", "memory.max") == str(3 << 30)
    assert fs2.read("kubepods", "hugetlb.2MB.max") == str(64 * Mi)
    assert fs2.read("kubepods", "hugetlb.1GB.max") == "0"


async def test_v2_start_below_a_custom_cgroup_root(fs2: FakeCgroup2fs) -> None:
    (fs2.root / "custom").mkdir()
    cgroups = QOSCgroups(fs2.root, "/custom")
    await cgroups.start()
    assert {"cpu", "memory"} <= fs2.enabled("/custom")
    assert fs2.read("custom/kubepods/besteffort", "cpu.weight") == "1"
    assert cgroups.cgroup_parent(BURSTABLE) == f"/custom/kubepods/burstable/pod{UID}"
    with pytest.raises(CgroupError, match="cgroup root '/nowhere' does not exist"):
        await QOSCgroups(fs2.root, "/nowhere").start()


async def test_v2_start_refuses_a_missing_required_controller(fs2: FakeCgroup2fs) -> None:
    (fs2.root / "cgroup.controllers").write_text("cpuset cpu io pids\n")
    with pytest.raises(CgroupError, match="cgroup v2 controller 'memory' is not available"):
        await QOSCgroups(fs2.root).start()


async def test_v2_pod_cgroups_get_go_s_values(fs2: FakeCgroup2fs) -> None:
    cgroups = QOSCgroups(fs2.root, pod_pids_limit=100)
    await cgroups.start()
    await cgroups.ensure_pod(GUARANTEED)
    guaranteed = f"kubepods/pod{UID}"
    assert fs2.read(guaranteed, "cpu.weight") == "20", "512 shares"
    assert fs2.read(guaranteed, "cpu.max") == "50000 100000"
    assert fs2.read(guaranteed, "memory.max") == str(128 * Mi)
    assert fs2.read(guaranteed, "memory.min") == "0", "MemoryQoS (off in Go) is not done"
    assert fs2.read(guaranteed, "pids.max") == "100"
    assert fs2.read(guaranteed, "hugetlb.2MB.max") == "0", "huge pages not requested"
    assert fs2.enabled(guaranteed) == set(), "runc enables what its containers need"

    other = make_pod(requests={"cpu": "250m"}, uid="0b9c6f2e-1d2a-4c3b-9e8f-7a6b5c4d3e2f")
    await QOSCgroups(fs2.root).ensure_pod(other)
    burstable = f"kubepods/burstable/pod{other.metadata.uid}"
    assert fs2.read(burstable, "cpu.weight") == "10"
    assert fs2.read(burstable, "cpu.max") == "max 100000", "no limit on every container"
    assert fs2.read(burstable, "memory.max") == "max"
    assert fs2.read(burstable, "pids.max") == "max", "podPidsLimit unset"


async def test_v2_ensure_pod_leaves_an_existing_pod_cgroup_alone(fs2: FakeCgroup2fs) -> None:
    cgroups = QOSCgroups(fs2.root)
    await cgroups.start()
    await cgroups.ensure_pod(GUARANTEED)
    (fs2.root / "kubepods" / f"pod{UID}" / "cpu.weight").write_text("777")
    await cgroups.ensure_pod(GUARANTEED)
    assert fs2.read(f"kubepods/pod{UID}", "cpu.weight") == "777"


async def test_v2_update_qos_follows_the_burstable_requests(fs2: FakeCgroup2fs) -> None:
    cgroups = QOSCgroups(fs2.root)
    with pytest.raises(CgroupError, match="kubepods/burstable"):
        await cgroups.update_qos([BURSTABLE])
    await cgroups.start()
    await cgroups.update_qos([BURSTABLE, make_pod(requests={"cpu": "1"}, uid="other")])
    assert fs2.read("kubepods/burstable", "cpu.weight") == "49", "1280 shares"


async def test_v2_remove_pod_kills_what_is_left_and_removes_the_cgroup(
    fs2: FakeCgroup2fs,
) -> None:
    cgroups = QOSCgroups(fs2.root)
    await cgroups.start()
    await cgroups.ensure_pod(BEST_EFFORT)
    await cgroups.ensure_pod(make_pod(requests={"cpu": "1"}, uid="burst"))
    pod = fs2.root / "kubepods" / "besteffort" / f"pod{UID}"
    (pod / "cgroup.subtree_control").write_text("+cpu +memory +pids")
    (pod / "c0ffee").mkdir()  # what runc makes: the container's cgroup in the same tree
    assert await cgroups.orphans([]) == sorted(["burst", UID])
    leftover = subprocess.Popen(["sleep", "60"])
    try:
        (pod / "c0ffee" / "cgroup.procs").write_text(f"{leftover.pid}\n")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_empty_procs_when_dead, leftover, pod / "c0ffee" / "cgroup.procs")
            await cgroups.remove_pod(UID)
        assert leftover.returncode == -9
    finally:
        leftover.kill()
        leftover.wait()
    assert not pod.exists() and (fs2.root / "kubepods" / "besteffort").is_dir()
    assert await cgroups.orphans(["burst"]) == []


def _cgroup_v2_as_root() -> bool:
    return os.geteuid() == 0 and detect_mode(REAL_ROOT) is CgroupMode.V2


@pytest.fixture
def real_v2_parent() -> Iterator[str]:
    parent = f"trio-kubelet-test-{secrets.token_hex(4)}"
    (REAL_ROOT / parent).mkdir()
    try:
        yield parent
    finally:
        _remove_real_v2(REAL_ROOT / parent)


def _remove_real_v2(top: Path) -> None:
    for directory, _, _ in os.walk(top, topdown=False):
        os.rmdir(directory)


@pytest.mark.skipif(not _cgroup_v2_as_root(), reason="needs root on a cgroup v2 hierarchy")
async def test_a_real_v2_pod_cgroup_is_created_joined_and_removed(real_v2_parent: str) -> None:
    cgroups = QOSCgroups(REAL_ROOT, f"/{real_v2_parent}", pod_pids_limit=50)
    await cgroups.start([BURSTABLE])
    await cgroups.ensure_pod(GUARANTEED)
    pod = REAL_ROOT / real_v2_parent / "kubepods" / f"pod{UID}"
    assert (pod / "cpu.weight").read_text().strip() == "20"
    assert (pod / "cpu.max").read_text().strip() == "50000 100000"
    assert (pod / "memory.max").read_text().strip() == str(128 * Mi)
    assert (pod / "pids.max").read_text().strip() == "50"
    tier = REAL_ROOT / real_v2_parent / "kubepods" / "burstable"
    assert (tier / "cpu.weight").read_text().strip() == "10"

    def join(pid: int) -> None:
        # A process may join only a leaf: the container's cgroup, as runc makes it.
        (pod / "cgroup.subtree_control").write_text("+cpu +memory +pids")
        (pod / "c0ffee").mkdir()
        (pod / "c0ffee" / "cgroup.procs").write_text(str(pid))

    await _removed_with_its_process(cgroups, join)
    assert not pod.exists()

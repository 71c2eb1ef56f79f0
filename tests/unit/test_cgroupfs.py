"""resources.cgroupfs: the mode, the figure readers of both hierarchies, inotify, v2 writers."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.cgroupfs_fake import CONTROLLERS, FakeCgroup2fs
from trio_kubelet.inotify import Inotify
from trio_kubelet.resources.cgroupfs import (
    CgroupMode,
    CgroupRoots,
    detect_mode,
    make_cgroup,
    page_size,
    parse_keyed,
    read_cgroup,
    read_oom_kills,
    set_cpu,
    set_hugetlb,
    write_control,
)

MiB = 1 << 20
V2_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc\n"

# What a busybox container's cgroup shows on Linux 6.1 (cgroup v2), trimmed of nothing but
# its middle lines: the readers must pick their keys out of the full files.
CPU_STAT = """\
usage_usec 5000123
user_usec 4000000
system_usec 1000123
nr_periods 12
nr_throttled 3
throttled_usec 45000
nr_bursts 0
burst_usec 0
"""
MEMORY_STAT = f"""\
anon {60 * MiB}
file {40 * MiB}
kernel 2195456
kernel_stack 65536
pagetables 270336
sec_pagetables 0
percpu 1296
sock 0
vmalloc 0
shmem {8 * MiB}
zswap 0
zswapped 0
file_mapped 1048576
file_dirty 0
file_writeback 0
swapcached 0
anon_thp 0
file_thp 0
shmem_thp 0
inactive_anon {50 * MiB}
active_anon {10 * MiB}
inactive_file {30 * MiB}
active_file {10 * MiB}
unevictable 0
slab_reclaimable 319600
slab_unreclaimable 409272
slab 728872
workingset_refault_anon 0
workingset_refault_file 0
workingset_activate_anon 0
workingset_activate_file 0
workingset_restore_anon 0
workingset_restore_file 0
workingset_nodereclaim 0
pgscan 0
pgsteal 0
pgscan_kswapd 0
pgscan_direct 0
pgsteal_kswapd 0
pgsteal_direct 0
pgfault 1000
pgmajfault 7
pgrefill 0
pgactivate 3
pgdeactivate 0
pglazyfree 0
pglazyfreed 0
zswpin 0
zswpout 0
thp_fault_alloc 0
thp_collapse_alloc 0
"""
MEMORY_EVENTS = "low 0\nhigh 0\nmax 4\noom 2\noom_kill {}\noom_group_kill 0\n"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_root(base: Path) -> Path:
    root = base / "cgroup"
    write(root / "cgroup.controllers", V2_CONTROLLERS)
    write(root / "cgroup.subtree_control", "cpu memory pids\n")
    return root


def v2_container(root: Path, cgroup: str, *, limit: str = f"{128 * MiB}", kills: int = 0) -> Path:
    directory = root / cgroup.strip("/")
    write(directory / "cpu.stat", CPU_STAT)
    write(directory / "memory.stat", MEMORY_STAT)
    write(directory / "memory.current", f"{100 * MiB}\n")
    write(directory / "memory.max", f"{limit}\n")
    write(directory / "memory.events", MEMORY_EVENTS.format(kills))
    write(directory / "pids.current", "4\n")
    return directory


# -- the mode ------------------------------------------------------------------------------------


def test_the_mode_is_what_the_root_mounts(tmp_path: Path) -> None:
    assert detect_mode(v2_root(tmp_path / "unified")) is CgroupMode.V2
    v1 = tmp_path / "v1"
    for controller in ("cpu", "memory"):
        (v1 / controller).mkdir(parents=True)
    assert detect_mode(v1) is CgroupMode.V1
    # Hybrid: v1 controllers plus an empty cgroup2 below the root, as systemd mounts it.
    write(v1 / "unified" / "cgroup.controllers", "\n")
    assert detect_mode(v1) is CgroupMode.V1


def test_roots_are_per_controller_on_v1_and_one_on_v2(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    top = os.fsencode(root)
    assert CgroupRoots.under(root) == CgroupRoots(CgroupMode.V2, top, top, top)
    assert CgroupRoots.under(tmp_path / "none").memory == os.fsencode(tmp_path / "none/memory")


# -- figures -------------------------------------------------------------------------------------


def test_parse_keyed_picks_its_keys() -> None:
    assert parse_keyed(b"rss 1\ntotal_rss 5\ntotal_inactive_file 3\nbogus\n",
                       {b"total_rss", b"total_inactive_file"}) == {
        b"total_rss": 5, b"total_inactive_file": 3}
    assert parse_keyed(CPU_STAT.encode(), {b"usage_usec"}) == {b"usage_usec": 5000123}


def test_a_v2_cgroup_reads_as_cadvisor_reports_it(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    v2_container(root, "/kubepods/burstable/pod1/abc")
    figures = read_cgroup(CgroupRoots.under(root), b"/kubepods/burstable/pod1/abc")
    assert figures is not None
    assert figures.cpu_usage_ns == 5_000_123_000, "usage_usec in ns"
    assert figures.memory_usage_bytes == 100 * MiB, "memory.current"
    assert figures.memory_working_set_bytes == 70 * MiB, "current - inactive_file"
    assert (figures.memory_rss_bytes, figures.memory_cache_bytes) == (60 * MiB, 40 * MiB)
    assert figures.memory_limit_bytes == 128 * MiB
    assert (figures.page_faults, figures.major_page_faults) == (1000, 7)
    assert figures.threads == 4
    assert figures.memory_failcnt is None, "v2 has no failcnt"


def test_v2_without_a_limit_and_without_a_cgroup(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    v2_container(root, "/k8s.io/abc", limit="max")
    roots = CgroupRoots.under(root)
    figures = read_cgroup(roots, b"/k8s.io/abc")
    assert figures is not None and figures.memory_limit_bytes is None
    assert read_cgroup(roots, b"/k8s.io/gone") is None


def test_the_v2_root_has_its_usage_from_memory_stat_as_runc_emulates_it(tmp_path: Path) -> None:
    root = v2_root(tmp_path)
    # The root has cpu.stat and memory.stat, but no memory.current, memory.max, pids.current.
    write(root / "cpu.stat", "usage_usec 525997225\nuser_usec 472675690\n"
          "system_usec 53321534\nnice_usec 152000\n")
    write(root / "memory.stat", MEMORY_STAT)
    figures = read_cgroup(CgroupRoots.under(root), b"")
    assert figures is not None
    assert figures.cpu_usage_ns == 525_997_225_000
    assert figures.memory_usage_bytes == 100 * MiB, "anon + file"
    assert figures.memory_working_set_bytes == 70 * MiB
    assert figures.memory_limit_bytes is None and figures.threads is None
    (root / "memory.stat").unlink()
    figures = read_cgroup(CgroupRoots.under(root), b"")
    assert figures is not None and figures.memory_usage_bytes is None, "left to /proc/meminfo"


def test_a_v1_cgroup_reads_from_each_controller(tmp_path: Path) -> None:
    write(tmp_path / "cpuacct" / "k8s.io" / "abc" / "cpuacct.usage", "42\n")
    memory = tmp_path / "memory" / "k8s.io" / "abc"
    write(memory / "memory.usage_in_bytes", f"{100 * MiB}\n")
    write(memory / "memory.limit_in_bytes", "9223372036854771712\n")
    write(memory / "memory.failcnt", "3\n")
    write(memory / "memory.stat", f"cache 1\ntotal_cache {40 * MiB}\ntotal_rss {60 * MiB}\n"
          f"total_inactive_file {30 * MiB}\ntotal_pgfault 9\ntotal_pgmajfault 1\n")
    write(tmp_path / "pids" / "k8s.io" / "abc" / "pids.current", "2\n")
    figures = read_cgroup(CgroupRoots.under(tmp_path), b"/k8s.io/abc")
    assert figures is not None
    assert (figures.cpu_usage_ns, figures.memory_working_set_bytes) == (42, 70 * MiB)
    assert (figures.memory_limit_bytes, figures.memory_failcnt, figures.threads) == (None, 3, 2)


def test_the_oom_kill_counter_of_memory_events(tmp_path: Path) -> None:
    directory = v2_container(v2_root(tmp_path), "/k8s.io/abc", kills=3)
    assert read_oom_kills(os.fsencode(directory)) == 3
    assert read_oom_kills(os.fsencode(tmp_path / "gone")) is None


# -- inotify -------------------------------------------------------------------------------------


def test_inotify_reports_a_modified_file_and_a_dropped_watch(tmp_path: Path) -> None:
    events = v2_container(v2_root(tmp_path), "/k8s.io/abc") / "memory.events"
    inotify = Inotify()
    try:
        assert inotify.read() == [], "non-blocking: nothing queued yet"
        wd = inotify.add_watch(os.fsencode(events))
        events.write_text(MEMORY_EVENTS.format(1))
        assert (wd, Inotify.MODIFY) in inotify.read()
        inotify.rm_watch(wd)
        assert [mask for _, mask in inotify.read()] == [Inotify.IGNORED]
        inotify.rm_watch(wd)  # already gone: not an error
        with pytest.raises(FileNotFoundError):
            inotify.add_watch(os.fsencode(tmp_path / "gone" / "memory.events"))
    finally:
        inotify.close()


# -- writing (v2) ------------------------------------------------------------------------------


def test_controls_are_written_never_created(tmp_path: Path) -> None:
    write(tmp_path / "cpu.weight", "100\n")
    write_control(tmp_path / "cpu.weight", "39")
    assert (tmp_path / "cpu.weight").read_text() == "39"
    with pytest.raises(FileNotFoundError):
        write_control(tmp_path / "cpu.max", "max 100000")


def test_make_cgroup_enables_the_root_s_controllers_on_the_way_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FakeCgroup2fs(tmp_path / "cgroup")
    fs.install(monkeypatch)
    leaf = make_cgroup(fs.root, ("kubepods", "burstable"), required=("cpu", "memory"))
    assert leaf == fs.root / "kubepods" / "burstable" and leaf.is_dir()
    assert fs.enabled("/") == fs.enabled("/kubepods") == set(CONTROLLERS)
    assert fs.enabled("/kubepods/burstable") == set(), "the leaf is runc's to enable"
    assert fs.read("/kubepods/burstable", "cpu.weight") == "100", "its files are there"
    make_cgroup(fs.root, ("kubepods", "burstable"), required=("cpu", "memory"))  # exists: kept


def test_make_cgroup_skips_controllers_a_parent_cannot_enable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = v2_root(tmp_path)
    written: list[str] = []

    def kernel(path: Path, value: str) -> None:
        # The kernel refuses a write naming a controller the cgroup does not have.
        if "misc" in value or "rdma" in value:
            raise OSError(errno.ENOENT, "No such file or directory", str(path))
        written.append(value)

    monkeypatch.setattr("trio_kubelet.resources.cgroupfs.write_control", kernel)
    make_cgroup(root, ("kubepods",), required=("cpu", "memory"))
    assert written == ["+cpu", "+cpuset", "+hugetlb", "+io", "+memory", "+pids"]

    def no_memory(path: Path, value: str) -> None:
        if value != "+cpu":
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))

    monkeypatch.setattr("trio_kubelet.resources.cgroupfs.write_control", no_memory)
    with pytest.raises(OSError, match="cannot enable the memory controller: Device or resource "
                                      "busy"):
        make_cgroup(root, ("kubepods",), required=("cpu", "memory"))


def test_cpu_weight_and_cpu_max(tmp_path: Path) -> None:
    write(tmp_path / "cpu.weight", "100\n")
    write(tmp_path / "cpu.max", "max 100000\n")
    set_cpu(tmp_path, 20, 50000, 100000)
    assert ((tmp_path / "cpu.weight").read_text(), (tmp_path / "cpu.max").read_text()) == (
        "20", "50000 100000")
    set_cpu(tmp_path, None, None, 100000)
    assert (tmp_path / "cpu.max").read_text() == "max 100000", "no quota: unlimited"
    set_cpu(tmp_path, 10, None, None)
    assert ((tmp_path / "cpu.weight").read_text(), (tmp_path / "cpu.max").read_text()) == (
        "10", "max 100000"), "shares only: cpu.max as it was"


def test_every_page_size_the_cgroup_offers_gets_a_hugetlb_limit(tmp_path: Path) -> None:
    for name in ("hugetlb.2MB.max", "hugetlb.2MB.rsvd.max", "hugetlb.1GB.max",
                 "hugetlb.1GB.rsvd.max", "hugetlb.2MB.current", "hugetlb.2MB.events"):
        write(tmp_path / name, "max\n" if name.endswith("max") else "0\n")
    set_hugetlb(tmp_path, {2 * MiB: 64 * MiB}, default=0)
    assert (tmp_path / "hugetlb.2MB.max").read_text() == str(64 * MiB)
    assert (tmp_path / "hugetlb.2MB.rsvd.max").read_text() == str(64 * MiB)
    assert (tmp_path / "hugetlb.1GB.max").read_text() == "0"
    assert (tmp_path / "hugetlb.2MB.current").read_text() == "0\n"
    assert (page_size("64KB"), page_size("1GB")) == (64 << 10, 1 << 30)

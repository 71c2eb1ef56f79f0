"""sources.sampler: figures read from fake cgroup v1 and v2 trees and /proc, rates, pods, gone
cgroups."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trio_kubelet.core.stats import Sample
from trio_kubelet.runtime import labels as L
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2 as upb
from trio_kubelet.runtime.errors import CRIUnavailable, StatusCode
from trio_kubelet.sources.sampler import (
    CgroupLocator,
    Sampler,
    parse_loadavg,
    parse_proc_stat,
)

UNLIMITED = 9223372036854771712
MiB = 1 << 20
T0 = 1_700_000_000.0


class FakeCgroups:
    """A cgroup tree and a /proc in a temporary directory: v1 (cpuacct, memory, pids
    mounts) or v2 (one unified hierarchy, the files as Linux 6.1 writes them)."""

    def __init__(self, base: Path, mode: str = "v1") -> None:
        self.mode = mode
        self.root = base / "cgroup"
        self.proc = base / "proc"
        if mode == "v2":
            self.write(self.root / "cgroup.controllers", "cpuset cpu io memory hugetlb pids\n")
        else:
            for controller in ("cpuacct", "memory", "pids"):
                (self.root / controller).mkdir(parents=True)
        (self.proc / "sys" / "kernel" / "random").mkdir(parents=True)
        self.write(self.proc / "cpuinfo", "processor\t: 0\nprocessor\t: 1\n")
        self.write(self.proc / "meminfo", "MemTotal:  4096000 kB\nMemFree:  1024000 kB\n"
                   "Inactive(file):  512000 kB\nAnonPages: 256000 kB\nCached: 700000 kB\n")
        self.write(self.proc / "stat", "cpu  100 0 50 1000 10 0 0 0 0 0\nbtime 1690000000\n")
        self.write(self.proc / "loadavg", "0.10 0.20 0.30 3/250 12345\n")
        self.write(self.proc / "sys" / "kernel" / "pid_max", "32768\n")
        self.write(self.proc / "sys" / "kernel" / "random" / "boot_id", "boot-1\n")
        self.node(cpu_ns=10_000_000_000, usage=2048 * MiB, inactive_file=512 * MiB)

    @staticmethod
    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def directory(self, cgroup: str, controller: str = "memory") -> Path:
        """Where a cgroup's files for ``controller`` are."""
        if self.mode == "v2":
            return self.root / cgroup.lstrip("/")
        return self.root / controller / cgroup.lstrip("/")

    def _files(self, cgroup: str, cpu_ns: int, usage: int, inactive_file: int, rss: int,
               limit: int, failcnt: int, pids: int | None) -> None:
        if self.mode == "v2":
            self._files_v2(cgroup, cpu_ns, usage, inactive_file, rss, limit, failcnt, pids)
            return
        rel = cgroup.lstrip("/")
        memory = self.root / "memory" / rel
        self.write(self.root / "cpuacct" / rel / "cpuacct.usage", f"{cpu_ns}\n")
        self.write(memory / "memory.usage_in_bytes", f"{usage}\n")
        self.write(memory / "memory.limit_in_bytes", f"{limit}\n")
        self.write(memory / "memory.failcnt", f"{failcnt}\n")
        self.write(memory / "memory.stat", (
            f"cache 1\nrss 2\ninactive_file 3\ntotal_cache {usage - rss}\ntotal_rss {rss}\n"
            f"total_inactive_file {inactive_file}\ntotal_pgfault 1000\ntotal_pgmajfault 7\n"))
        if pids is not None:
            self.write(self.root / "pids" / rel / "pids.current", f"{pids}\n")

    def _files_v2(self, cgroup: str, cpu_ns: int, usage: int, inactive_file: int, rss: int,
                  limit: int, failcnt: int, pids: int | None) -> None:
        directory = self.directory(cgroup)
        usec = cpu_ns // 1000
        self.write(directory / "cpu.stat", f"usage_usec {usec}\nuser_usec {usec // 2}\n"
                   f"system_usec {usec - usec // 2}\nnr_periods 0\nnr_throttled 0\n")
        self.write(directory / "memory.stat", (
            f"anon {rss}\nfile {usage - rss}\nkernel 8192\nshmem 0\nfile_mapped 0\n"
            f"inactive_anon {rss}\nactive_anon 0\ninactive_file {inactive_file}\n"
            f"active_file {usage - rss - inactive_file}\nunevictable 0\npgfault 1000\n"
            "pgmajfault 7\n"))
        if cgroup:  # the root has neither of these
            self.write(directory / "memory.current", f"{usage}\n")
            self.write(directory / "memory.max",
                       "max\n" if limit == UNLIMITED else f"{limit}\n")
            self.write(directory / "memory.events",
                       f"low 0\nhigh 0\nmax {failcnt}\noom 0\noom_kill 0\n")
        if pids is not None:
            self.write(directory / "pids.current", f"{pids}\n")

    def node(self, *, cpu_ns: int, usage: int, inactive_file: int) -> None:
        self._files("", cpu_ns, usage, inactive_file, usage // 4, UNLIMITED, 0, None)

    def container(self, id: str, *, cpu_ns: int = 0, usage: int = 10 * MiB,
                  inactive_file: int = 2 * MiB, rss: int = 6 * MiB, limit: int = UNLIMITED,
                  failcnt: int = 0, pids: int = 1, parent: str = "/k8s.io") -> None:
        self._files(f"{parent}/{id}", cpu_ns, usage, inactive_file, rss, limit, failcnt, pids)

    def remove(self, id: str, parent: str = "/k8s.io") -> None:
        for controller in ("cpuacct", "memory", "pids"):
            directory = self.directory(f"{parent}/{id}", controller)
            for child in directory.glob("*"):
                child.unlink()
            if directory.exists():
                directory.rmdir()


class FakeRuntime:
    """The four CRI calls of a tick, answering with real upb / betterproto messages."""

    def __init__(self) -> None:
        self.containers: list[upb.Container] = []
        self.sandboxes: list[upb.PodSandbox] = []
        self.stats: list[v1.ContainerStats] = []
        self.image_fs = v1.ImageFsInfoResponse(image_filesystems=[v1.FilesystemUsage(
            used_bytes=v1.UInt64Value(300 * MiB), inodes_used=v1.UInt64Value(1234))])
        self.images = [v1.Image(id="sha256:abc", repo_tags=["docker.io/library/busybox:1.36"])]
        self.image_lists = 0
        self.down = False
        self.bug = False
        self.calls = 0

    def pod(self, uid: str, name: str, namespace: str = "default", *,
            containers: Sequence[str] = ("app",),
            state: upb.ContainerState = upb.CONTAINER_RUNNING) -> list[str]:
        """A ready sandbox ``sb-<uid>`` and containers ``<uid>-<name>``; returns their ids."""
        labels = {L.POD_UID: uid, L.POD_NAME: name, L.POD_NAMESPACE: namespace}
        self.sandboxes.append(upb.PodSandbox(
            id=f"sb-{uid}", labels=labels, state=upb.SANDBOX_READY,
            created_at=int((T0 - 100) * 1e9),
            metadata=upb.PodSandboxMetadata(name=name, namespace=namespace, uid=uid)))
        ids = []
        for container in containers:
            id = f"{uid}-{container}"
            self.containers.append(upb.Container(
                id=id, pod_sandbox_id=f"sb-{uid}", state=state,
                labels={**labels, L.CONTAINER_NAME: container},
                metadata=upb.ContainerMetadata(name=container),
                image=upb.ImageSpec(image="sha256:abc", user_specified_image="busybox:1.36"),
                created_at=int((T0 - 50) * 1e9)))
            ids.append(id)
        return ids

    def _check(self) -> None:
        self.calls += 1
        if self.bug:
            raise RuntimeError("a bug")
        if self.down:
            raise CRIUnavailable("ListContainers", StatusCode.UNAVAILABLE, "connection refused")

    async def list_containers_brief(self, *, call_timeout: float | None = None) -> list[Any]:
        self._check()
        return list(self.containers)

    async def list_pod_sandbox_brief(self, *, call_timeout: float | None = None) -> list[Any]:
        self._check()
        return list(self.sandboxes)

    async def list_container_stats_brief(
        self, *, call_timeout: float | None = None
    ) -> list[upb.ContainerStats]:
        self._check()
        return [upb.ContainerStats.FromString(bytes(stats)) for stats in self.stats]

    async def image_fs_info(self, *, call_timeout: float | None = None) -> v1.ImageFsInfoResponse:
        self._check()
        return self.image_fs

    async def list_images(self, *, call_timeout: float | None = None) -> list[v1.Image]:
        self._check()
        self.image_lists += 1
        return list(self.images)


@pytest.fixture(params=["v1", "v2"])
def cgroups(tmp_path: Path, request: pytest.FixtureRequest) -> FakeCgroups:
    return FakeCgroups(tmp_path, request.param)


def make_sampler(cgroups: FakeCgroups, tmp_path: Path, **kwargs: Any) -> Sampler:
    logs = tmp_path / "pod-logs"
    logs.mkdir(exist_ok=True)
    options: dict[str, Any] = dict(
        cgroup_root=cgroups.root, proc_root=cgroups.proc, root_fs=tmp_path, image_fs=tmp_path,
        pod_logs_dir=logs, wall_clock=lambda: T0 + float(trio.current_time()), offload=False,
    )
    return Sampler(**{**options, **kwargs})


def only_pod(sample: Sample) -> Any:
    assert len(sample.pods) == 1
    return sample.pods[0]


# -- parsing -------------------------------------------------------------------------------------


def test_parsers_read_the_kernel_formats() -> None:
    # busy = user + nice + system + irq + softirq + steal (idle and iowait excluded)
    cpu_ns, boot = parse_proc_stat(b"cpu  1 2 3 100 200 4 5 6 0 0\nbtime 17\n", 100)
    assert (cpu_ns, boot) == (21 * 10_000_000, 17.0)
    assert parse_loadavg(b"0.1 0.2 0.3 3/250 99\n") == 250
    assert parse_loadavg(b"garbage") is None


# -- figures -------------------------------------------------------------------------------------


async def test_container_figures_come_from_its_cgroup_files(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    app, sidecar = runtime.pod("uid-1", "web", "prod", containers=("app", "sidecar"))
    cgroups.container("sb-uid-1", cpu_ns=1_000, usage=1 * MiB, inactive_file=0, rss=MiB)
    cgroups.container(app, cpu_ns=5_000_000_000, usage=100 * MiB, inactive_file=30 * MiB,
                      rss=60 * MiB, limit=128 * MiB, failcnt=3, pids=4)
    cgroups.container(sidecar, cpu_ns=1_000_000_000, usage=20 * MiB, inactive_file=5 * MiB,
                      rss=10 * MiB, pids=2)

    sample = await make_sampler(cgroups, tmp_path).sample_once(runtime)

    pod = only_pod(sample)
    assert (pod.uid, pod.name, pod.namespace) == ("uid-1", "web", "prod")
    assert pod.start_time == T0 - 100, "a pod starts when its sandbox was created"
    assert [c.ref.name for c in pod.containers] == ["app", "sidecar"]
    assert pod.sandbox is not None and pod.sandbox.ref.sandbox
    figures = pod.containers[0].figures
    assert figures.cpu_usage_ns == 5_000_000_000
    assert figures.memory_usage_bytes == 100 * MiB
    assert figures.memory_working_set_bytes == 70 * MiB, "usage - total_inactive_file"
    assert figures.memory_rss_bytes == 60 * MiB
    assert figures.memory_cache_bytes == 40 * MiB
    assert figures.memory_limit_bytes == 128 * MiB
    assert (figures.page_faults, figures.major_page_faults) == (1000, 7)
    # v2 has no failcnt (memory.events' "max" is not the same count; cAdvisor writes 0).
    assert figures.memory_failcnt == (3 if cgroups.mode == "v1" else None)
    assert figures.threads == 4
    assert pod.containers[1].figures.memory_limit_bytes is None, "no limit"
    assert pod.containers[0].ref.cgroup == f"/k8s.io/{app}"
    assert pod.containers[0].ref.image == "busybox:1.36", "the image the user asked for"
    # The pod is its containers and its sandbox summed.
    assert pod.figures.cpu_usage_ns == 6_000_001_000
    assert pod.figures.memory_working_set_bytes == 86 * MiB
    assert pod.figures.threads == 7
    assert pod.figures.memory_limit_bytes is None, "one container has no limit"
    assert pod.cpu_nano_cores is None, "no rate from a single sample"


async def test_node_figures_come_from_the_root_cgroup_proc_and_statvfs(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    sample = await make_sampler(cgroups, tmp_path).sample_once(FakeRuntime())
    node = sample.node.reading
    assert node.figures.cpu_usage_ns == 10_000_000_000
    assert node.figures.memory_working_set_bytes == 1536 * MiB
    assert (node.max_pid, node.processes) == (32768, 250)
    assert node.root_fs is not None and node.root_fs.capacity_bytes > 0
    assert node.image_fs is not None and node.image_fs_usage is not None
    assert node.image_fs_usage.used_bytes == 300 * MiB
    machine = sample.machine
    assert (machine.num_cores, machine.memory_capacity_bytes) == (2, 4096000 * 1024)
    assert (machine.boot_time, machine.boot_id) == (1690000000.0, "boot-1")
    assert sample.errors == ()


async def test_the_pods_cgroup_is_read_for_the_pods_as_a_whole(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    sample = await make_sampler(cgroups, tmp_path, pods_cgroup="/kubepods").sample_once(
        FakeRuntime())
    assert sample.node.reading.pods is None, "no such cgroup (yet)"
    cgroups.container("kubepods", parent="", usage=300 * MiB, inactive_file=100 * MiB)
    sample = await make_sampler(cgroups, tmp_path, pods_cgroup="/kubepods/").sample_once(
        FakeRuntime())
    pods = sample.node.reading.pods
    assert pods is not None and pods.memory_working_set_bytes == 200 * MiB
    sample = await make_sampler(cgroups, tmp_path).sample_once(FakeRuntime())
    assert sample.node.reading.pods is None, "not asked for (cgroupsPerQOS off)"


async def test_the_image_filesystem_defaults_to_the_runtime_s_mount_point(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    runtime.image_fs.image_filesystems[0].fs_id = v1.FilesystemIdentifier(
        mountpoint=str(tmp_path))
    sampler = make_sampler(cgroups, tmp_path, image_fs=None)
    sample = await sampler.sample_once(runtime)
    image_fs, root_fs = sample.node.reading.image_fs, sample.node.reading.root_fs
    assert image_fs is not None and root_fs is not None
    assert image_fs.capacity_bytes == root_fs.capacity_bytes, "both are tmp_path's filesystem"


async def test_node_falls_back_to_proc_without_a_root_cgroup(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    names = (("cpu.stat", "memory.stat") if cgroups.mode == "v2" else
             ("cpuacct/cpuacct.usage", "memory/memory.usage_in_bytes"))
    for name in names:
        (cgroups.root / name).unlink()
    sample = await make_sampler(cgroups, tmp_path).sample_once(FakeRuntime())
    figures = sample.node.figures
    assert figures.cpu_usage_ns == 150 * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    assert figures.memory_usage_bytes == 3072000 * 1024, "MemTotal - MemFree"
    assert figures.memory_working_set_bytes == (3072000 - 512000) * 1024


async def test_cpu_rates_come_from_the_previous_sample(
    cgroups: FakeCgroups, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime = FakeRuntime()
    (app,) = runtime.pod("uid-1", "web")
    cgroups.container("sb-uid-1", cpu_ns=0)
    cgroups.container(app, cpu_ns=1_000_000_000)
    sampler = make_sampler(cgroups, tmp_path)
    first = await sampler.sample_once(runtime)
    assert only_pod(first).containers[0].cpu_nano_cores is None
    assert first.node.cpu_nano_cores is None

    await trio.sleep(10)
    cgroups.container(app, cpu_ns=6_000_000_000)  # 5 core-seconds in 10 s: half a core
    cgroups.node(cpu_ns=30_000_000_000, usage=2048 * MiB, inactive_file=0)
    second = await sampler.sample_once(runtime)

    pod = only_pod(second)
    assert pod.containers[0].cpu_nano_cores == 500_000_000
    assert pod.sandbox is not None and pod.sandbox.cpu_nano_cores == 0
    assert pod.cpu_nano_cores == 500_000_000
    assert second.node.cpu_nano_cores == 2_000_000_000
    assert second.timestamp - first.timestamp == pytest.approx(10)
    assert sampler.latest is second


async def test_a_container_without_cgroup_is_skipped_silently(
    cgroups: FakeCgroups, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = FakeRuntime()
    kept, gone = runtime.pod("uid-1", "web", containers=("kept", "gone"))
    cgroups.container(kept)
    cgroups.container(gone)
    sampler = make_sampler(cgroups, tmp_path)
    assert len(only_pod(await sampler.sample_once(runtime)).containers) == 2

    cgroups.remove(gone)  # exited between two ticks; the runtime still lists it running
    sample = await sampler.sample_once(runtime)
    assert [c.ref.name for c in only_pod(sample).containers] == ["kept"]
    assert sample.errors == () and not caplog.records


async def test_runtime_figures_stand_in_for_an_unreachable_cgroup(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    (app,) = runtime.pod("uid-1", "web")
    runtime.stats.append(v1.ContainerStats(
        attributes=v1.ContainerAttributes(id=app),
        cpu=v1.CpuUsage(timestamp=1, usage_core_nano_seconds=v1.UInt64Value(42)),
        memory=v1.MemoryUsage(timestamp=1, working_set_bytes=v1.UInt64Value(7 * MiB),
                              usage_bytes=v1.UInt64Value(9 * MiB)),
        writable_layer=v1.FilesystemUsage(used_bytes=v1.UInt64Value(4096),
                                          inodes_used=v1.UInt64Value(3))))
    sample = await make_sampler(cgroups, tmp_path).sample_once(runtime)
    (container,) = only_pod(sample).containers
    assert container.figures.cpu_usage_ns == 42
    assert container.figures.memory_working_set_bytes == 7 * MiB
    assert container.ref.cgroup == ""
    assert container.rootfs is not None and container.rootfs.used_bytes == 4096


async def test_unset_runtime_figures_stay_unknown(cgroups: FakeCgroups, tmp_path: Path) -> None:
    """upb answers an unset field with a default message: unset must read as None, not 0."""
    runtime = FakeRuntime()
    (app,) = runtime.pod("uid-1", "web")
    runtime.stats.append(v1.ContainerStats(
        attributes=v1.ContainerAttributes(id=app),
        memory=v1.MemoryUsage(timestamp=1, working_set_bytes=v1.UInt64Value(0))))
    runtime.stats.append(v1.ContainerStats(cpu=v1.CpuUsage(timestamp=1)))  # no id: ignored
    sample = await make_sampler(cgroups, tmp_path).sample_once(runtime)
    (container,) = only_pod(sample).containers
    assert container.figures.memory_working_set_bytes == 0
    assert container.figures.cpu_usage_ns is None
    assert container.figures.memory_usage_bytes is None
    assert container.rootfs is None


async def test_writable_layer_and_logs_are_measured(cgroups: FakeCgroups, tmp_path: Path) -> None:
    runtime = FakeRuntime()
    (app,) = runtime.pod("uid-1", "web", "prod")
    cgroups.container(app)
    runtime.stats.append(v1.ContainerStats(
        attributes=v1.ContainerAttributes(id=app),
        writable_layer=v1.FilesystemUsage(used_bytes=v1.UInt64Value(8192),
                                          inodes_used=v1.UInt64Value(5))))
    log_dir = tmp_path / "pod-logs" / "prod_web_uid-1" / "app"
    log_dir.mkdir(parents=True)
    (log_dir / "0.log").write_bytes(b"x" * 10_000)

    sample = await make_sampler(cgroups, tmp_path).sample_once(runtime)
    (container,) = only_pod(sample).containers
    assert container.figures.cpu_usage_ns == 0, "the cgroup wins over the runtime's figures"
    assert container.rootfs is not None and container.rootfs.used_bytes == 8192
    assert container.logs is not None and container.logs.inodes_used == 2
    assert container.logs.used_bytes == (log_dir / "0.log").stat().st_blocks * 512


async def test_only_running_containers_the_kubelet_made_are_sampled(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    (exited,) = runtime.pod("uid-1", "web", state=upb.CONTAINER_EXITED)
    runtime.containers.append(upb.Container(id="foreign", state=upb.CONTAINER_RUNNING))
    cgroups.container(exited)
    cgroups.container("foreign")
    sample = await make_sampler(cgroups, tmp_path).sample_once(runtime)
    assert [c.ref.id for c in sample.containers()] == [], "sandbox without cgroup skipped"


async def test_a_runtime_outage_keeps_the_last_container_list(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    (app,) = runtime.pod("uid-1", "web")
    cgroups.container(app, cpu_ns=5000)
    sampler = make_sampler(cgroups, tmp_path)
    await sampler.sample_once(runtime)
    runtime.down = True
    cgroups.container(app, cpu_ns=9000)
    sample = await sampler.sample_once(runtime)
    assert only_pod(sample).containers[0].figures.cpu_usage_ns == 9000
    assert len(sample.errors) == 3 and "connection refused" in sample.errors[0]
    assert sample.node.reading.image_fs_usage is None


async def test_oom_counts_reach_the_latest_sample_at_once(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    (app,) = runtime.pod("uid-1", "web")
    cgroups.container(app)
    sampler = make_sampler(cgroups, tmp_path)
    sampler.set_oom_counts({app: 1})
    first = await sampler.sample_once(runtime)
    assert first.oom_events == {app: 1}
    sampler.set_oom_counts({app: 2})
    assert sampler.latest is not None and sampler.latest.oom_events == {app: 2}
    assert sampler.latest.pods == first.pods
    assert (await sampler.sample_once(runtime)).oom_events == {app: 2}


async def test_run_samples_every_interval(
    cgroups: FakeCgroups, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime = FakeRuntime()
    sampler = make_sampler(cgroups, tmp_path, offload=True)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: sampler.run(
            runtime, interval=10.0, task_status=task_status))
        first = sampler.latest
        assert first is not None, "ready only once the first sample exists"

        await trio.sleep(9.5)
        assert sampler.latest is first
        # The reads run in a thread: only let the mock clock jump after 50 ms of real
        # idleness, or it races the thread to the deadline.
        autojump_clock.autojump_threshold = 0.05
        with trio.fail_after(5):
            while sampler.latest is first:
                await trio.sleep(0.01)
        assert sampler.latest is not None
        assert sampler.latest.monotonic - first.monotonic == pytest.approx(10)
        nursery.cancel_scope.cancel()


async def test_image_ids_are_named_from_the_runtime_s_images(
    cgroups: FakeCgroups, tmp_path: Path
) -> None:
    runtime = FakeRuntime()
    (app,) = runtime.pod("uid-1", "web")
    runtime.containers[0].image.user_specified_image = ""  # containerd 1.6 does not echo it
    cgroups.container(app)
    sampler = make_sampler(cgroups, tmp_path)
    sample = await sampler.sample_once(runtime)
    assert only_pod(sample).containers[0].ref.image == "docker.io/library/busybox:1.36"
    await sampler.sample_once(runtime)
    assert runtime.image_lists == 1, "images are listed only when a new id shows up"


async def test_a_failing_tick_does_not_stop_the_sampler(
    cgroups: FakeCgroups, tmp_path: Path, autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = FakeRuntime()
    runtime.bug = True
    sampler = make_sampler(cgroups, tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: sampler.run(
            runtime, interval=10.0, task_status=task_status))
        assert sampler.latest is None, "ready even so: the agent must not wait for figures"
        assert "Resource sampling failed" in caplog.text
        runtime.bug = False
        await trio.sleep(10.5)
        assert sampler.latest is not None, "the next tick samples again"
        nursery.cancel_scope.cancel()


def test_locator_finds_cgroups_outside_the_default_parent(cgroups: FakeCgroups) -> None:
    cgroups.container("abc", parent="/k8s.io")
    cgroups.container("def", parent="/kubepods/burstable/poduid-1")
    cgroups.container("fed", parent="/system.slice/cri-containerd-x.slice")
    slice = cgroups.directory("/system.slice/cri-containerd-x.slice")
    os.rename(slice / "fed", slice / "cri-containerd-fed.scope")
    locator = CgroupLocator(cgroups.root, rediscover_after=60)
    found = locator.locate({"abc": "uid-0", "def": "uid-1", "fed": "uid-2", "nope": "uid-3"},
                           now=0.0)
    assert found == {
        "abc": "/k8s.io/abc",
        "def": "/kubepods/burstable/poduid-1/def",
        "fed": "/system.slice/cri-containerd-x.slice/cri-containerd-fed.scope",
    }
    cgroups.container("nope", parent="/elsewhere")
    assert "nope" not in locator.locate({"nope": "uid-3"}, now=30.0), "no second walk in a minute"
    assert locator.locate({"nope": "uid-3"}, now=61.0) == {"nope": "/elsewhere/nope"}


def test_locator_looks_for_a_new_pod_cgroup_every_tick_without_walking(
    cgroups: FakeCgroups
) -> None:
    locator = CgroupLocator(cgroups.root, rediscover_after=60)
    pods = {"late": "uid-9", "moved": "uid-7"}
    assert locator.locate(pods, now=0.0) == {}  # walked once: neither is there yet
    cgroups.container("late", parent="/kubepods/besteffort/poduid-9")
    cgroups.container("moved", parent="/kubepods/besteffort/poduid-8")
    # Within the minute: found by the pod UID's places, no walk (which would find "moved").
    assert locator.locate(pods, now=1.0) == {
        "late": "/kubepods/besteffort/poduid-9/late"}


def test_locator_finds_pod_cgroups_below_the_cgroup_root_without_walking(
    cgroups: FakeCgroups
) -> None:
    locator = CgroupLocator(cgroups.root, qos_root="/node-a", rediscover_after=60)
    assert locator.locate({"early": "uid-1"}, now=0.0) == {}  # walked once: not there yet
    cgroups.container("early", parent="/node-a/kubepods/besteffort/poduid-1")
    # Within the minute, so no walk: found only because the places include the root.
    assert locator.locate({"early": "uid-1"}, now=1.0) == {
        "early": "/node-a/kubepods/besteffort/poduid-1/early"}

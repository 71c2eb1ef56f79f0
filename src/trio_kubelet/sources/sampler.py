"""The cAdvisor-style sampler: every housekeeping interval, read the cgroups, /proc and statvfs.

Each tick lists the running containers and sandboxes once (CRI, labels → pod and
container names), reads their cgroup files directly (`resources.cgroupfs`: cpuacct,
memory and pids on cgroup v1, cpu.stat, memory.* and pids.current on v2), the
root cgroup and /proc for the node, the kubepods cgroup for the pods as a whole,
statvfs of the node and image
filesystems, and the runtime's ListContainerStats for writable-layer usage (and
for cpu/memory of a container whose cgroup it cannot find). The result is an
immutable `Sample` kept in `Sampler.latest`: the HTTP servers render that, never
the file system per request.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import trio
from cgroupspy.trees import Tree

from trio_kubelet.core.pod_cgroups import POD_PREFIX, QOS_CGROUPS, cgroup_path
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
    build_sample,
    working_set,
)
from trio_kubelet.node.machine_info import (
    cpuinfo_processors,
    num_cores,
    parse_meminfo,
    read_machine_ids,
    read_meminfo,
)
from trio_kubelet.resources.cgroupfs import (
    CGROUP_ROOT,
    CgroupMode,
    CgroupRoots,
    read_bytes,
    read_cgroup,
    read_int,
)
from trio_kubelet.runtime import labels as L
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError

__all__ = [
    "CgroupLocator",
    "Sample",
    "Sampler",
    "StatsRuntime",
    "container_id_of",
    "read_machine_info",
]

log = logging.getLogger("trio_kubelet.sampler")

HOUSEKEEPING_INTERVAL = 10.0  # cAdvisor's --housekeeping_interval default
# containerd's CRI plugin puts a container with an empty cgroup_parent here (its namespace).
DEFAULT_CGROUP_PARENT = "/k8s.io"
CONTAINER_RUNNING = 1  # runtime.v1.ContainerState
SANDBOX_READY = 0  # runtime.v1.PodSandboxState


class StatsRuntime(Protocol):
    """The CRI calls the sampler makes (`CRIClient` has them)."""

    async def list_containers_brief(self, *, call_timeout: float | None = None) -> Sequence[Any]:
        ...

    async def list_pod_sandbox_brief(self, *, call_timeout: float | None = None) -> Sequence[Any]:
        ...

    async def list_container_stats_brief(
        self, *, call_timeout: float | None = None
    ) -> Sequence[Any]:
        ...

    async def image_fs_info(self, *, call_timeout: float | None = None) -> v1.ImageFsInfoResponse:
        ...

    async def list_images(self, *, call_timeout: float | None = None) -> list[v1.Image]:
        ...


# -- /proc and statvfs ----------------------------------------------------------------------


def parse_proc_stat(data: bytes, clock_ticks: int) -> tuple[int | None, float]:
    """(busy CPU time of all cores in ns, boot time in epoch seconds) from /proc/stat."""
    cpu_ns: int | None = None
    boot_time = 0.0
    for line in data.decode().splitlines():
        if line.startswith("cpu "):
            # user nice system idle iowait irq softirq steal: idle and iowait are not use.
            ticks = [int(v) for v in line.split()[1:9]]
            busy = sum(ticks) - ticks[3] - ticks[4]
            cpu_ns = busy * 1_000_000_000 // clock_ticks
        elif line.startswith("btime "):
            boot_time = float(line.split()[1])
    return cpu_ns, boot_time


def parse_loadavg(data: bytes) -> int | None:
    """The number of scheduling entities (processes and threads) from /proc/loadavg."""
    fields = data.split()
    if len(fields) < 4 or b"/" not in fields[3]:
        return None
    return int(fields[3].partition(b"/")[2])


def statvfs(path: Path) -> FsFigures | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return FsFigures(
        capacity_bytes=st.f_blocks * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        inodes=st.f_files,
        inodes_free=st.f_ffree,
    )


def log_usage(directory: bytes) -> FsUsage | None:
    """Disk use of a container's log directory as du counts it (allocated blocks)."""
    used, inodes = 0, 1
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                used += st.st_blocks * 512
                inodes += 1
    except OSError:
        return None
    return FsUsage(used_bytes=used, inodes_used=inodes)


def _device_of(path: Path, mountinfo: bytes) -> str:
    """The source device of the mount holding ``path`` (cAdvisor's ``device`` label)."""
    try:
        st = os.stat(path)
        resolved = os.path.realpath(path)
    except OSError:
        return ""
    wanted = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    best, best_len = "", -1
    for line in mountinfo.decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[2] != wanted or " - " not in line:
            continue
        mount_point = fields[4]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > best_len:
            after = line.split(" - ", 1)[1].split()
            best, best_len = (after[1] if len(after) > 1 else ""), len(mount_point)
    return best


def read_machine_info(proc_root: Path = Path("/proc"), image_fs: Path | None = None) -> MachineInfo:
    """The machine facts the stats carry (cAdvisor's machine collector): the shared cores,
    memory and ids, plus the boot time and the image filesystem's device."""
    meminfo = read_meminfo(proc_root / "meminfo")
    _, boot_time = parse_proc_stat(
        read_bytes(os.fsencode(proc_root / "stat"), 1 << 20) or b"", os.sysconf("SC_CLK_TCK")
    )
    mountinfo = read_bytes(os.fsencode(proc_root / "self" / "mountinfo"), 1 << 20) or b""
    ids = read_machine_ids(Path("/"), proc_root)
    return MachineInfo(
        num_cores=num_cores(cpuinfo_processors(proc_root)),
        memory_capacity_bytes=meminfo.get("MemTotal", 0),
        boot_time=boot_time,
        boot_id=ids.boot_id,
        machine_id=ids.machine_id,
        system_uuid=ids.system_uuid,
        image_fs_device=_device_of(image_fs, mountinfo) if image_fs is not None else "",
    )


# -- where containers' cgroups are -----------------------------------------------------------


def container_id_of(cgroup: str) -> str:
    """The container id a cgroup path ends in.

    ``/k8s.io/<id>`` and ``…/pod<uid>/<id>`` (cgroupfs driver), or
    ``…/cri-containerd-<id>.scope`` (systemd driver).
    """
    name = cgroup.rstrip("/").rsplit("/", 1)[-1]
    if name.endswith(".scope"):
        name = name.removesuffix(".scope").rsplit("-", 1)[-1]
    return name


class CgroupLocator:
    """A container's cgroup path relative to the controllers' roots, cached per id.

    containerd puts a container with an empty ``cgroup_parent`` at
    ``/k8s.io/<id>``, and one in a pod cgroup (cgroupsPerQOS, cgroupfs driver) at
    ``[/<cgroupRoot>]/kubepods[/<tier>]/pod<uid>/<id>`` (``qos_root``: the kubelet's
    ``cgroupRoot``): both are a few stat calls, tried each tick until found. The paths
    are the same on cgroup v1 (below each controller's mount; the memory one is looked
    at) and v2 (below the one root). Anything else (the
    systemd driver's ``…/cri-containerd-<id>.scope``) is found by one walk of the
    memory hierarchy (cgroupspy's on v1, the whole tree on v2), at most every
    ``rediscover_after`` seconds per id, since a walk costs tens of milliseconds.
    """

    def __init__(
        self,
        cgroup_root: Path,
        parent: str = DEFAULT_CGROUP_PARENT,
        *,
        qos_root: str = "/",
        rediscover_after: float = 60.0,
    ) -> None:
        self._root = cgroup_root
        self._qos_root = qos_root
        self._roots = CgroupRoots.under(cgroup_root)
        self._memory = self._roots.memory
        self._parent = parent.rstrip("/")
        self._rediscover_after = rediscover_after
        self._known: dict[str, str] = {}
        self._searched: dict[str, float] = {}

    def locate(self, pods: Mapping[str, str], now: float) -> dict[str, str]:
        """The cgroup of each container id of ``pods`` (id -> its pod's UID) that has one;
        forgets ids not asked for."""
        self._known = {i: p for i, p in self._known.items() if i in pods}
        self._searched = {i: t for i, t in self._searched.items() if i in pods}
        due: set[str] = set()
        for id, uid in pods.items():
            if id in self._known:
                continue
            found = next((path for path in self._usual_places(id, uid)
                          if os.path.isdir(self._memory + os.fsencode(path))), None)
            if found is not None:
                self._known[id] = found
            elif now - self._searched.get(id, -math.inf) >= self._rediscover_after:
                due.add(id)
        if due:
            self._known.update(self._discover(due))
            self._searched.update(dict.fromkeys(due - self._known.keys(), now))
        return dict(self._known)

    def _usual_places(self, id: str, uid: str) -> list[str]:
        """The default parent, then the pod cgroup in each QoS tier."""
        places = [f"{self._parent}/{id}"]
        if uid:
            places += [cgroup_path((*tier, POD_PREFIX + uid, id), self._qos_root)
                       for tier in QOS_CGROUPS.values()]
        return places

    @property
    def base(self) -> bytes:
        """Where the located paths start: the memory hierarchy's mount (v1) or the root (v2)."""
        return self._memory

    def _discover(self, ids: set[str]) -> dict[str, str]:
        if self._roots.mode is CgroupMode.V2:
            return self._discover_v2(ids)
        found: dict[str, str] = {}
        try:
            tree = Tree(root_path=os.fsencode(self._root), groups=[b"memory"])
            for node in tree.walk():
                if node.node_type in (node.NODE_ROOT, node.NODE_CONTROLLER_ROOT):
                    continue
                name = container_id_of(node.name.decode(errors="replace"))
                if name in ids:
                    found[name] = node.path.decode().removeprefix("/memory")
        except OSError as err:
            log.debug("cgroup discovery failed: %s", err)
        return found

    def _discover_v2(self, ids: set[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        top = self._memory
        for directory, subdirectories, _ in os.walk(top, onerror=_walk_failed):
            for name in subdirectories:
                id = container_id_of(name.decode(errors="replace"))
                if id in ids:
                    found[id] = os.fsdecode(directory[len(top):] + b"/" + name)
        return found


def _walk_failed(err: OSError) -> None:
    log.debug("cgroup discovery: %s", err)  # a cgroup removed during the walk, typically


# -- the sampler ---------------------------------------------------------------------------------


def _uint(message: Any, name: str) -> int | None:
    wrapped = getattr(message, name, None) if message is not None else None
    return None if wrapped is None else int(wrapped.value)


def _upb_uint(message: Any, name: str) -> int | None:
    """A UInt64Value field of a upb message: None when unset (upb has no None) or when
    ``message`` itself is None."""
    if message is None or not message.HasField(name):
        return None
    return int(getattr(message, name).value)


def cri_container_figures(stats: Any) -> tuple[CgroupFigures | None, FsUsage | None]:
    """ListContainerStats of one container (a upb ``ContainerStats``): its cpu/memory and its
    writable layer's usage."""
    cpu = stats.cpu if stats.HasField("cpu") else None
    memory = stats.memory if stats.HasField("memory") else None
    figures = None
    if cpu is not None or memory is not None:
        figures = CgroupFigures(
            cpu_usage_ns=_upb_uint(cpu, "usage_core_nano_seconds"),
            memory_usage_bytes=_upb_uint(memory, "usage_bytes"),
            memory_working_set_bytes=_upb_uint(memory, "working_set_bytes"),
            memory_rss_bytes=_upb_uint(memory, "rss_bytes"),
            page_faults=_upb_uint(memory, "page_faults"),
            major_page_faults=_upb_uint(memory, "major_page_faults"),
        )
    rootfs = None
    if stats.HasField("writable_layer"):
        layer = stats.writable_layer
        rootfs = FsUsage(used_bytes=_upb_uint(layer, "used_bytes"),
                         inodes_used=_upb_uint(layer, "inodes_used"))
    return figures, rootfs


def _image(container: Any) -> str:
    spec = container.image
    return str(spec.user_specified_image or spec.image or container.image_ref)


def container_refs(containers: Iterable[Any], sandboxes: Iterable[Any]) -> list[ContainerRef]:
    """Running containers and ready sandboxes the kubelet created, from their CRI labels.

    The cgroup is left empty: the locator fills it in where the files are read.
    """
    refs: list[ContainerRef] = []
    for s in sandboxes:
        uid = s.labels.get(L.POD_UID)
        if s.state != SANDBOX_READY or not uid:
            continue
        refs.append(ContainerRef(
            id=s.id, name="", pod_uid=uid, pod_name=s.labels.get(L.POD_NAME, ""),
            pod_namespace=s.labels.get(L.POD_NAMESPACE, ""), image="",
            created_at=s.created_at / 1e9, cgroup="", sandbox=True,
        ))
    for c in containers:
        uid = c.labels.get(L.POD_UID)
        if c.state != CONTAINER_RUNNING or not uid:
            continue
        refs.append(ContainerRef(
            id=c.id, name=c.labels.get(L.CONTAINER_NAME) or c.metadata.name, pod_uid=uid,
            pod_name=c.labels.get(L.POD_NAME, ""),
            pod_namespace=c.labels.get(L.POD_NAMESPACE, ""), image=_image(c),
            created_at=c.created_at / 1e9, cgroup="",
        ))
    return refs


class Sampler:
    """Samples the node every housekeeping interval; `latest` is the newest `Sample`.

    ``cgroup_root`` and ``proc_root`` are parameters so tests can hand it a fake
    tree; ``root_fs`` is the node filesystem (the kubelet's root dir),
    ``image_fs`` the runtime's (containerd's root dir; None: the mount point the
    runtime reports in ImageFsInfo), ``pod_logs_dir`` where
    container logs go, ``volumes`` the latest pod volume figures (``volume_stats``),
    ``pods_cgroup`` the cgroup all pods are in (``/kubepods`` below the cgroup root,
    with cgroupsPerQOS; None: none), read as the Go kubelet's "pods" system container;
    ``qos_root`` the kubelet's ``cgroupRoot``, where the pod cgroups are looked for.
    File reads happen in a worker thread so a tick never
    stalls the servers or the reconciler (``offload=False`` reads inline).
    """

    def __init__(
        self,
        *,
        cgroup_root: Path = CGROUP_ROOT,
        proc_root: Path = Path("/proc"),
        root_fs: Path = Path("/"),
        image_fs: Path | None = None,
        pod_logs_dir: Path = Path("/var/log/pods"),
        cgroup_parent: str = DEFAULT_CGROUP_PARENT,
        wall_clock: Callable[[], float] = time.time,
        cri_stats: bool = True,
        offload: bool = True,
        call_timeout: float = 10.0,
        volumes: Callable[[], Mapping[str, tuple[VolumeUsage, ...]]] | None = None,
        pods_cgroup: str | None = None,
        qos_root: str = "/",
    ) -> None:
        self._roots = CgroupRoots.under(cgroup_root)
        self._pods_cgroup = None if pods_cgroup is None else pods_cgroup.rstrip("/").encode()
        self._volumes = volumes
        self._proc = os.fsencode(proc_root)
        self._proc_root = proc_root
        self._root_fs = root_fs
        self._image_fs = image_fs
        self._pod_logs = os.fsencode(pod_logs_dir)
        self._locator = CgroupLocator(cgroup_root, cgroup_parent, qos_root=qos_root)
        self._wall_clock = wall_clock
        self._cri_stats = cri_stats
        self._offload = offload
        self._call_timeout = call_timeout
        self._clock_ticks = os.sysconf("SC_CLK_TCK")
        self._machine: MachineInfo | None = None
        self._refs: list[ContainerRef] = []
        self._image_names: dict[str, str] = {}
        self._oom_counts: Mapping[str, int] = {}
        self._latest: Sample | None = None

    @property
    def latest(self) -> Sample | None:
        """The newest sample, or None before the first one."""
        return self._latest

    def set_oom_counts(self, counts: Mapping[str, int]) -> None:
        """Take the OOM watcher's per-container counts; the latest sample shows them at once."""
        self._oom_counts = dict(counts)
        if self._latest is not None:
            self._latest = self._latest.with_oom_events(self._oom_counts)

    async def run(
        self,
        client: StatsRuntime,
        *,
        interval: float = HOUSEKEEPING_INTERVAL,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Sample every ``interval`` seconds; ready once the first sample exists."""
        next_tick = trio.current_time()
        started = False
        while True:
            try:
                await self.sample_once(client)
            except Exception:
                # Figures are best effort: a failed tick must not take the node agent down.
                log.exception("Resource sampling failed; next try in %.0fs", interval)
            if not started:
                task_status.started()
                started = True
            # A slow tick delays the next one instead of queueing ticks behind it.
            next_tick = max(next_tick + interval, trio.current_time())
            await trio.sleep_until(next_tick)

    async def sample_once(self, client: StatsRuntime) -> Sample:
        """Take one sample now and make it `latest`."""
        errors: list[str] = []
        refs = await self._list(client, errors)
        cri = await self._container_stats(client, errors) if self._cri_stats else {}
        image_usage = await self._image_fs_usage(client, errors)
        if self._machine is None:
            self._machine = await self._run_sync(read_machine_info, self._proc_root,
                                                 self._image_fs)
        now = trio.current_time()
        wall = self._wall_clock()
        node, readings = await self._run_sync(self._read_files, refs, cri, image_usage, now)
        sample = build_sample(
            timestamp=wall, monotonic=now, machine=self._machine, node=node,
            containers=readings, previous=self._latest, oom_events=self._oom_counts,
            errors=errors, volumes=self._volumes() if self._volumes is not None else {},
        )
        self._latest = sample
        return sample

    async def _run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._offload:
            return await trio.to_thread.run_sync(fn, *args)
        return fn(*args)

    async def _list(self, client: StatsRuntime, errors: list[str]) -> list[ContainerRef]:
        """This tick's containers; the previous tick's when the runtime does not answer."""
        try:
            containers = await client.list_containers_brief(call_timeout=self._call_timeout)
            sandboxes = await client.list_pod_sandbox_brief(call_timeout=self._call_timeout)
        except CRIError as err:
            errors.append(f"listing containers: {err}")
            return self._refs
        refs = container_refs(containers, sandboxes)
        names = await self._names_of_images(client, {r.image for r in refs})
        self._refs = [replace(r, image=names[r.image]) if r.image in names else r for r in refs]
        return self._refs

    async def _names_of_images(self, client: StatsRuntime, images: set[str]) -> Mapping[str, str]:
        """Image ids ("sha256:…") → a name for cAdvisor's ``image`` label.

        The runtime is asked only when an id not seen before shows up.
        """
        new = {i for i in images if i.startswith("sha256:")} - self._image_names.keys()
        if new:
            try:
                listed = await client.list_images(call_timeout=self._call_timeout)
            except CRIError as err:
                log.debug("listing images failed: %s", err)
                return self._image_names
            named = {image.id: (image.repo_tags or image.repo_digests or [image.id])[0]
                     for image in listed}
            self._image_names = {**{id: id for id in new}, **named}  # unnamed: keep the id
        return self._image_names

    async def _container_stats(
        self, client: StatsRuntime, errors: list[str]
    ) -> dict[str, tuple[CgroupFigures | None, FsUsage | None]]:
        try:
            stats = await client.list_container_stats_brief(call_timeout=self._call_timeout)
        except CRIError as err:
            errors.append(f"container stats: {err}")
            return {}
        return {s.attributes.id: cri_container_figures(s) for s in stats if s.attributes.id}

    async def _image_fs_usage(self, client: StatsRuntime, errors: list[str]) -> FsUsage | None:
        try:
            info = await client.image_fs_info(call_timeout=self._call_timeout)
        except CRIError as err:
            errors.append(f"image filesystem: {err}")
            return None
        if not info.image_filesystems:
            return None
        fs = info.image_filesystems[0]
        if self._image_fs is None and fs.fs_id is not None and fs.fs_id.mountpoint:
            self._image_fs = Path(fs.fs_id.mountpoint)
        return FsUsage(used_bytes=_uint(fs, "used_bytes"), inodes_used=_uint(fs, "inodes_used"))

    def _read_files(
        self,
        refs: list[ContainerRef],
        cri: Mapping[str, tuple[CgroupFigures | None, FsUsage | None]],
        image_usage: FsUsage | None,
        now: float,
    ) -> tuple[NodeReading, list[ContainerReading]]:
        """Every file read of a tick (run in a worker thread)."""
        cgroups = self._locator.locate({r.id: r.pod_uid for r in refs}, now)
        readings: list[ContainerReading] = []
        for ref in refs:
            path = cgroups.get(ref.id, "")
            figures = read_cgroup(self._roots, path.encode()) if path else None
            cri_figures, rootfs = cri.get(ref.id, (None, None))
            if figures is None and cri_figures is None:
                continue  # exited since the list: skip silently
            logs = None
            if not ref.sandbox:
                logs = log_usage(b"%s/%s_%s_%s/%s" % (
                    self._pod_logs, ref.pod_namespace.encode(), ref.pod_name.encode(),
                    ref.pod_uid.encode(), ref.name.encode()))
            readings.append(ContainerReading(
                ref=replace(ref, cgroup=path), figures=figures, cri=cri_figures,
                rootfs=rootfs, logs=logs,
            ))
        return self._read_node(image_usage), readings

    def _read_node(self, image_usage: FsUsage | None) -> NodeReading:
        figures = read_cgroup(self._roots, b"") or CgroupFigures()
        if figures.cpu_usage_ns is None:
            cpu_ns, _ = parse_proc_stat(read_bytes(self._proc + b"/stat", 1 << 16) or b"",
                                        self._clock_ticks)
            figures = replace(figures, cpu_usage_ns=cpu_ns)
        if figures.memory_usage_bytes is None:
            figures = _meminfo_figures(figures, read_bytes(self._proc + b"/meminfo", 1 << 16))
        max_pid = read_int(self._proc + b"/sys/kernel/pid_max")
        loadavg = read_bytes(self._proc + b"/loadavg")
        pods = None if self._pods_cgroup is None else read_cgroup(self._roots, self._pods_cgroup)
        return NodeReading(
            figures=figures,
            pods=pods,
            root_fs=statvfs(self._root_fs),
            image_fs=statvfs(self._image_fs) if self._image_fs is not None else None,
            image_fs_usage=image_usage,
            max_pid=max_pid,
            processes=parse_loadavg(loadavg) if loadavg else None,
        )


def _meminfo_figures(figures: CgroupFigures, data: bytes | None) -> CgroupFigures:
    """Node memory from /proc/meminfo when the root memory cgroup cannot be read."""
    meminfo = parse_meminfo(data) if data else {}
    if "MemTotal" not in meminfo or "MemFree" not in meminfo:
        return figures
    usage = meminfo["MemTotal"] - meminfo["MemFree"]
    return replace(
        figures,
        memory_usage_bytes=usage,
        memory_working_set_bytes=working_set(usage, meminfo.get("Inactive(file)")),
        memory_rss_bytes=meminfo.get("AnonPages"),
        memory_cache_bytes=meminfo.get("Cached"),
    )

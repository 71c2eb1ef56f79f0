"""The OOM watcher: the kernel's OOM kills inside containers, as events and per-container counts.

Two signals, because neither is enough alone:

* the container's memory cgroup wakes us on an OOM in it, and we then read its
  ``oom_kill`` counter. On cgroup v1 through an eventfd on ``memory.oom_control``
  (registered through ``cgroup.event_control``); on cgroup v2 through inotify: the
  kernel raises ``IN_MODIFY`` on the cgroup's ``memory.events`` whenever one of its
  counters moves, and ``oom_kill`` is one of them. It cannot see a container that
  was OOM-killed before we registered, nor read the counter once the container
  exited: its memory cgroup disappears with it.
* ``/dev/kmsg`` carries every kill ("oom-kill:… task_memcg=/k8s.io/<id>…" then
  "Memory cgroup out of memory: Killed process …"), early ones included.

A container's count is the larger of the two tallies, so a kill both signals
report is counted once. Each increase is sent as an `OOMEvent`.

Which containers exist comes from the PLEG's relists (`OOMWatcher.update`), not
from listing the runtime a second time every second.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import trio

from trio_kubelet.core.observed import ContainerState, RuntimePodStatus
from trio_kubelet.events import OOMEvent
from trio_kubelet.inotify import Inotify
from trio_kubelet.resources.cgroupfs import (
    CGROUP_ROOT,
    CgroupMode,
    detect_mode,
    read_oom_kills,
)
from trio_kubelet.sources.sampler import (
    DEFAULT_CGROUP_PARENT,
    CgroupLocator,
    container_id_of,
)

__all__ = [
    "KernelOOM",
    "KmsgOOMParser",
    "OOMWatcher",
    "read_oom_kill_count",
    "register_oom_eventfd",
]

log = logging.getLogger("trio_kubelet.oom")

# The oom_kill counter may lag the eventfd: the kernel notifies before it kills.
_RECHECK_DELAYS = (0.01, 0.1, 1.0)


# -- /dev/kmsg -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KernelOOM:
    """One OOM kill as the kernel log tells it."""

    memcg: str  # the killed task's memory cgroup
    pid: int
    process: str

    @property
    def container_id(self) -> str:
        return container_id_of(self.memcg)


_OOM_KILL = re.compile(rb"^oom-kill:.*?\btask_memcg=([^,]*),task=([^,]*),pid=(\d+)")
_TASK_IN = re.compile(rb"^Task in (\S+) killed as a result of limit of \S+")  # before 4.19
_KILLED = re.compile(rb"Killed process (\d+) \(([^)]*)\)")


class KmsgOOMParser:
    """Turns /dev/kmsg records into `KernelOOM`s (the kill completes on "Killed process")."""

    def __init__(self) -> None:
        self._memcg: str | None = None
        self._pid = 0

    def feed(self, data: bytes) -> list[KernelOOM]:
        """One or more records ("<prio>,<seq>,<usec>,<flags>;<message>\\n[ continuation]…")."""
        kills: list[KernelOOM] = []
        for line in data.split(b"\n"):
            if not line or line.startswith(b" "):
                continue  # continuation lines carry dictionary fields
            message = line.partition(b";")[2]
            kill = self._message(message)
            if kill is not None:
                kills.append(kill)
        return kills

    def _message(self, message: bytes) -> KernelOOM | None:
        if match := _OOM_KILL.match(message):
            self._memcg = match[1].decode(errors="replace")
            self._pid = int(match[3])
        elif match := _TASK_IN.match(message):
            self._memcg, self._pid = match[1].decode(errors="replace"), 0
        elif (match := _KILLED.search(message)) and self._memcg is not None:
            pid = int(match[1])
            memcg, self._memcg = self._memcg, None
            if self._pid in (0, pid):
                return KernelOOM(memcg=memcg, pid=pid, process=match[2].decode(errors="replace"))
        return None


# -- memory.oom_control --------------------------------------------------------------------------


def register_oom_eventfd(cgroup_dir: bytes) -> int:
    """An eventfd the kernel signals on each OOM in the cgroup (and once when it is removed).

    Raises OSError (ENOENT) when the cgroup does not exist (any more).
    """
    efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        control = os.open(cgroup_dir + b"/memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            events = os.open(cgroup_dir + b"/cgroup.event_control", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(events, b"%d %d" % (efd, control))
            finally:
                os.close(events)
        finally:
            os.close(control)  # the kernel keeps what it needs once registered
    except BaseException:
        os.close(efd)
        raise
    return efd


def read_oom_kill_count(cgroup_dir: bytes) -> int | None:
    """The cgroup's ``oom_kill`` counter, or None when the cgroup is gone."""
    try:
        with open(cgroup_dir + b"/memory.oom_control", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for line in data.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key == b"oom_kill":
            return int(value)
    return 0  # kernels before 4.13 do not count; /dev/kmsg still does


class _EventfdWake:
    """cgroup v1: the eventfd registered on the container's memory.oom_control."""

    def __init__(self, efd: int) -> None:
        self._efd = efd

    async def wait(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._efd)
            try:
                os.eventfd_read(self._efd)
                return
            except BlockingIOError:
                continue

    def close(self) -> None:
        os.close(self._efd)


class _EventsFileWake:
    """cgroup v2: ``IN_MODIFY`` of the container's memory.events, from the watcher's one
    inotify instance (its reader calls `notify`)."""

    def __init__(self, inotify: Inotify, wd: int, wakes: dict[int, _EventsFileWake]) -> None:
        self._inotify = inotify
        self._wd = wd
        self._wakes = wakes
        self._event = trio.Event()
        wakes[wd] = self

    def notify(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()  # a change while the counter is re-read wakes us again

    def close(self) -> None:
        del self._wakes[self._wd]
        self._inotify.rm_watch(self._wd)


_Wake = _EventfdWake | _EventsFileWake


@dataclass(frozen=True, slots=True)
class _Identity:
    pod_uid: str
    pod_name: str
    pod_namespace: str
    container_name: str


class OOMWatcher:
    """Watches for OOM kills in the kubelet's containers; `counts` per container id.

    The containers to watch are those of the last relist given to `update`
    (the PLEG's ``on_relist``). ``cgroup_root`` is where the cgroups are mounted
    (v1 or v2, as `resources.cgroupfs.detect_mode` finds it); ``kmsg`` None turns
    the kernel log off.
    ``on_counts`` is called with the new counts after every change (the
    sampler's `set_oom_counts`).
    ``offload=False`` locates cgroups on the event loop instead of a worker
    thread (for tests on trio's mock clock). ``qos_root`` is the kubelet's
    ``cgroupRoot``, below which the pod cgroups are looked for.
    """

    def __init__(
        self,
        *,
        cgroup_root: Path = CGROUP_ROOT,
        kmsg: Path | None = Path("/dev/kmsg"),
        cgroup_parent: str = DEFAULT_CGROUP_PARENT,
        wall_clock: Callable[[], float] = time.time,
        on_counts: Callable[[Mapping[str, int]], None] | None = None,
        offload: bool = True,
        qos_root: str = "/",
    ) -> None:
        self._v2 = detect_mode(cgroup_root) is CgroupMode.V2
        self._locator = CgroupLocator(cgroup_root, cgroup_parent, qos_root=qos_root)
        self._memory = self._locator.base
        self._kmsg_path = kmsg
        self._wall_clock = wall_clock
        self._on_counts = on_counts
        self._offload = offload
        self._inotify: Inotify | None = None  # v2, while `run` runs
        self._wakes: dict[int, _EventsFileWake] = {}  # by inotify watch descriptor
        self._known: dict[str, _Identity] = {}
        self._watches: dict[str, trio.CancelScope] = {}
        self._kernel: dict[str, int] = {}  # oom_kill counters read from the cgroups
        self._kmsg: dict[str, int] = {}  # kills the kernel log attributed to each container
        self._counts: dict[str, int] = {}
        self._unresolved: list[KernelOOM] = []  # kmsg kills of containers not listed yet
        self._pods: Mapping[str, RuntimePodStatus] = {}  # the latest relist, applied by `run`
        self._updated = trio.Event()
        self._send: trio.MemorySendChannel[OOMEvent] | None = None

    @property
    def counts(self) -> Mapping[str, int]:
        """OOM kills seen per container id (``container_oom_events_total``)."""
        return MappingProxyType(self._counts)

    def watched(self) -> frozenset[str]:
        """The containers with a registered eventfd."""
        return frozenset(self._watches)

    def update(self, pods: Mapping[str, RuntimePodStatus]) -> None:
        """Take a relist's pods (by UID); `run` applies the latest at once.

        Only a reference is kept and no work done here: the PLEG calls this on
        its hot path. ``pods`` must not change afterwards (each relist is new).
        """
        self._pods = pods
        self._updated.set()

    async def run(
        self,
        send: trio.MemorySendChannel[OOMEvent],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Watch until cancelled; an eventfd is registered once `update` lists a container.

        Before the first `update` nothing is armed; the kernel log's kills wait
        for the relist that names their container.
        """
        self._inotify = self._open_inotify() if self._v2 else None
        try:
            async with send, trio.open_nursery() as nursery:
                self._send = send
                kmsg = self._open_kmsg()
                if kmsg is not None:  # the task owns (and closes) the descriptor from here
                    nursery.start_soon(self._watch_kmsg, kmsg)
                if self._inotify is not None:
                    nursery.start_soon(self._watch_inotify, self._inotify)
                nursery.start_soon(self._apply_loop, nursery)
                task_status.started()
        finally:
            if self._inotify is not None:
                trio.lowlevel.notify_closing(self._inotify.fd)
                self._inotify.close()
                self._inotify = None

    def _open_inotify(self) -> Inotify | None:
        try:
            return Inotify()
        except OSError as err:  # EMFILE: the user's 128 instances are taken
            log.warning("Cannot watch memory.events (%s): OOM kills are seen through %s only",
                        err, self._kmsg_path)
            return None

    # -- the container list

    async def _apply_loop(self, nursery: trio.Nursery) -> None:
        while True:
            await self._updated.wait()
            self._updated = trio.Event()
            await self._apply(self._pods, nursery)

    async def _apply(self, pods: Mapping[str, RuntimePodStatus], nursery: trio.Nursery) -> None:
        known: dict[str, _Identity] = {}
        running: dict[str, str] = {}  # container id -> its pod's UID
        for pod in pods.values():
            for c in pod.containers:
                known[c.id] = _Identity(pod.uid, pod.name, pod.namespace, c.name)
                if c.state is ContainerState.RUNNING:
                    running[c.id] = pod.uid
        self._known = known
        self._forget(known.keys())
        unresolved, self._unresolved = self._unresolved, []
        for kill in unresolved:
            if kill.container_id in known:
                await self._publish(kill.container_id, kill)
            else:  # not a container of ours (a system service, another runtime)
                self._kmsg.pop(kill.container_id, None)
        now = trio.current_time()
        # Locating is a few stats per new container, but a cgroupspy walk (tens of ms) for
        # one outside the usual places: off the event loop unless told otherwise (tests).
        if self._offload:
            cgroups = await trio.to_thread.run_sync(self._locator.locate, running, now)
        else:
            cgroups = self._locator.locate(running, now)
        for id, scope in list(self._watches.items()):
            if id not in cgroups:
                scope.cancel()
        for id, path in cgroups.items():
            if id not in self._watches:
                self._start_watch(id, self._memory + path.encode(), nursery)

    def _forget(self, listed: Container[str]) -> None:
        """Drop the tallies of containers the runtime no longer has."""
        counted = len(self._counts)
        for tally in (self._kernel, self._kmsg, self._counts):
            for id in [id for id in tally if id not in listed]:
                del tally[id]
        if len(self._counts) != counted and self._on_counts is not None:
            self._on_counts(self.counts)

    # -- a notification per container

    def _arm(self, cgroup_dir: bytes) -> _Wake | None:
        """What wakes us on an OOM in the cgroup (None: nothing can, on v2 without an inotify
        instance); OSError (ENOENT) when the cgroup is gone."""
        if not self._v2:
            return _EventfdWake(register_oom_eventfd(cgroup_dir))
        if self._inotify is None:
            return None
        wd = self._inotify.add_watch(cgroup_dir + b"/memory.events")
        return _EventsFileWake(self._inotify, wd, self._wakes)

    def _start_watch(self, id: str, cgroup_dir: bytes, nursery: trio.Nursery) -> None:
        """Arm the container's notification now; a task then waits on it."""
        try:
            wake = self._arm(cgroup_dir)
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENODEV):  # else: it exited meanwhile
                log.info("No OOM notification for container %s (kmsg still counts): %s",
                         id, err)
            return
        if wake is None:
            return
        scope = self._watches[id] = trio.CancelScope()
        nursery.start_soon(self._watch_container, id, cgroup_dir, wake, scope)

    async def _watch_container(
        self, id: str, cgroup_dir: bytes, wake: _Wake, scope: trio.CancelScope
    ) -> None:
        try:
            with scope:
                await self._watch_counter(id, cgroup_dir, wake)
        finally:
            wake.close()
            if self._watches.get(id) is scope:
                del self._watches[id]

    async def _watch_counter(self, id: str, cgroup_dir: bytes, wake: _Wake) -> None:
        if not await self._read_counter(id, cgroup_dir):
            return
        while True:
            await wake.wait()
            before = self._kernel.get(id, 0)
            for delay in (0.0, *_RECHECK_DELAYS):
                await trio.sleep(delay)
                if not await self._read_counter(id, cgroup_dir):
                    return  # the cgroup is gone (the removal signals too): that is normal
                if self._kernel.get(id, 0) > before:
                    break

    async def _read_counter(self, id: str, cgroup_dir: bytes) -> bool:
        count = read_oom_kills(cgroup_dir) if self._v2 else read_oom_kill_count(cgroup_dir)
        if count is None:
            return False
        if count > self._kernel.get(id, 0):
            self._kernel[id] = count
            await self._publish(id)
        return True

    async def _watch_inotify(self, inotify: Inotify) -> None:
        """Hand each memory.events change to its container's watch (all of them when the
        kernel's queue overflowed and changes were lost)."""
        while True:
            await trio.lowlevel.wait_readable(inotify.fd)
            for wd, mask in inotify.read():
                if mask & Inotify.OVERFLOW:
                    woken = list(self._wakes.values())
                else:
                    woken = [self._wakes[wd]] if wd in self._wakes else []
                for wake in woken:
                    wake.notify()

    # -- /dev/kmsg

    def _open_kmsg(self) -> int | None:
        if self._kmsg_path is None:
            return None
        try:
            fd = os.open(self._kmsg_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as err:
            log.warning("Cannot read %s (%s): OOM kills are seen through eventfds only",
                        self._kmsg_path, err)
            return None
        with contextlib.suppress(OSError):  # a pipe (in tests) cannot seek
            os.lseek(fd, 0, os.SEEK_END)  # only kills from now on
        return fd

    async def _watch_kmsg(self, fd: int) -> None:
        parser = KmsgOOMParser()
        try:
            while True:
                try:
                    data = os.read(fd, 8192)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(fd)
                    continue
                except BrokenPipeError:
                    continue  # the ring buffer overwrote records we had not read yet
                except OSError as err:
                    log.warning("Reading %s failed (%s); OOM kills are seen through eventfds "
                                "only", self._kmsg_path, err)
                    return
                if not data:
                    log.warning("%s was closed; OOM kills are seen through eventfds only",
                                self._kmsg_path)
                    return
                for kill in parser.feed(data):
                    await self._kernel_log_kill(kill)
                await trio.lowlevel.checkpoint()
        finally:
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    async def _kernel_log_kill(self, kill: KernelOOM) -> None:
        id = kill.container_id
        self._kmsg[id] = self._kmsg.get(id, 0) + 1
        if id in self._known:
            await self._publish(id, kill)
        else:  # a container started and killed since the last relist, or not ours
            self._unresolved.append(kill)

    # -- counting

    async def _publish(self, id: str, kill: KernelOOM | None = None) -> None:
        count = max(self._kernel.get(id, 0), self._kmsg.get(id, 0))
        if count <= self._counts.get(id, 0):
            return  # the other signal already counted this kill
        self._counts[id] = count
        if self._on_counts is not None:
            self._on_counts(self.counts)
        who = self._known.get(id, _Identity("", "", "", ""))
        log.info("OOM kill in container %s (%s/%s %s)%s", id[:13], who.pod_namespace,
                 who.pod_name, who.container_name,
                 f": {kill.process} [{kill.pid}]" if kill else "")
        if self._send is not None:
            await self._send.send(OOMEvent(
                container_id=id, pod_uid=who.pod_uid, pod_name=who.pod_name,
                pod_namespace=who.pod_namespace, container_name=who.container_name,
                time=self._wall_clock(), count=count,
                process=kill.process if kill else "", pid=kill.pid if kill else 0,
            ))

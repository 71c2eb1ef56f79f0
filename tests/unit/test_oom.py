"""sources.oom: kernel-log parsing, eventfds (v1) and memory.events (v2) on fake cgroup trees,
counting each kill once."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_kubelet.core.observed import ContainerState, RuntimeContainer, RuntimePodStatus
from trio_kubelet.sources.oom import (
    KernelOOM,
    KmsgOOMParser,
    OOMEvent,
    OOMWatcher,
    read_oom_kill_count,
    register_oom_eventfd,
)
from trio_kubelet.sources.sampler import container_id_of

ID = "41c51cd137a0c7e4954c1f761bea5ce681b9269c156ef8a5e37e4f7ca4fb50ce"
# Recorded on this project's VM (kernel 6.18, cgroup v1) when dd hit a 16Mi limit.
KMSG_6_18 = [
    b"4,7467,3302679779,-;dd invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, "
    b"oom_score_adj=0\n",
    b"4,7473,3302679826,-; oom_kill_process.cold+0x8/0x8a\n",
    f"6,7590,3302680225,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={ID},"
    f"mems_allowed=0,oom_memcg=/k8s.io/{ID},task_memcg=/k8s.io/{ID},task=dd,pid=31278,"
    "uid=0\n".encode(),
    b"3,7591,3302680250,-;Memory cgroup out of memory: Killed process 31278 (dd) total-vm:67804kB,"
    b" anon-rss:15872kB, file-rss:1264kB, shmem-rss:0kB, UID:0 pgtables:72kB oom_score_adj:0\n",
]
# Kernels before 4.19 name the cgroups on their own line.
KMSG_4_14 = [
    b"6,900,100,-;Task in /kubepods/pod1/abc killed as a result of limit of /kubepods/pod1\n",
    b"3,901,101,-;Memory cgroup out of memory: Kill process 77 (java) score 999 or sacrifice "
    b"child\n",
    b"3,902,102,-;Killed process 77 (java) total-vm:100kB, anon-rss:50kB, file-rss:0kB\n",
]


def kill_records(id: str, pid: int = 31278, task: str = "dd") -> bytes:
    return (
        f"6,1,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset={id},"
        f"mems_allowed=0,oom_memcg=/k8s.io/{id},task_memcg=/k8s.io/{id},task={task},"
        f"pid={pid},uid=0\n"
        f"3,2,2,-;Memory cgroup out of memory: Killed process {pid} ({task}) total-vm:1kB\n"
    ).encode()


# -- the kernel log ------------------------------------------------------------------------------


def test_parser_reads_a_memcg_kill_of_current_kernels() -> None:
    parser = KmsgOOMParser()
    kills = [kill for record in KMSG_6_18 for kill in parser.feed(record)]
    assert kills == [KernelOOM(memcg=f"/k8s.io/{ID}", pid=31278, process="dd")]
    assert kills[0].container_id == ID


def test_parser_reads_the_older_two_line_form() -> None:
    parser = KmsgOOMParser()
    kills = parser.feed(b"".join(KMSG_4_14))
    assert kills == [KernelOOM(memcg="/kubepods/pod1/abc", pid=77, process="java")]


def test_parser_needs_the_cgroup_line_and_a_matching_pid() -> None:
    parser = KmsgOOMParser()
    lonely = b"3,1,1,-;Out of memory: Killed process 5 (x) total-vm:1kB\n"
    assert parser.feed(lonely) == [], "a kill without its cgroup cannot be attributed"
    assert parser.feed(kill_records("abc", pid=9).replace(b"process 9 ", b"process 10 ")) == []
    assert parser.feed(b"6,5,5,-;eth0: link up\n SUBSYSTEM=net\n") == []
    assert parser.feed(kill_records("a") + kill_records("b", pid=3)) == [
        KernelOOM("/k8s.io/a", 31278, "dd"), KernelOOM("/k8s.io/b", 3, "dd")]


@pytest.mark.parametrize(("cgroup", "id"), [
    (f"/k8s.io/{ID}", ID),
    (f"/kubepods/burstable/pod1234/{ID}", ID),
    (f"/kubepods.slice/kubepods-pod1.slice/cri-containerd-{ID}.scope", ID),
])
def test_container_id_of_a_cgroup(cgroup: str, id: str) -> None:
    assert container_id_of(cgroup) == id


# -- memory.oom_control --------------------------------------------------------------------------


def make_cgroup(root: Path, id: str, oom_kill: int = 0) -> Path:
    """The container's memory cgroup, in whichever hierarchy ``root`` holds."""
    v2 = (root / "cgroup.controllers").exists()
    directory = root / ("" if v2 else "memory") / "k8s.io" / id
    directory.mkdir(parents=True, exist_ok=True)
    if not v2:
        (directory / "cgroup.event_control").write_text("")
    set_oom_kill(directory, oom_kill)
    return directory


def set_oom_kill(directory: Path, count: int) -> None:
    """The cgroup's oom_kill counter moves: on v1 silently (the eventfd is separate), on v2
    by modifying memory.events, which is a notification in itself, as in the kernel."""
    if (directory / "cgroup.event_control").exists():
        (directory / "memory.oom_control").write_text(
            f"oom_kill_disable 0\nunder_oom 0\noom_kill {count}\n")
    else:
        (directory / "memory.events").write_text(
            f"low 0\nhigh 0\nmax {count}\noom {count}\noom_kill {count}\noom_group_kill 0\n")


def notify(directory: Path) -> None:
    """What the kernel does on an OOM: signal the eventfd (v1), modify memory.events (v2:
    its "oom" counter moves before "oom_kill" does)."""
    if (directory / "cgroup.event_control").exists():
        os.eventfd_write(registered_eventfd(directory), 1)
    else:
        events = directory / "memory.events"
        events.write_text(events.read_text())


def registered_eventfd(directory: Path) -> int:
    """The eventfd the watcher wrote into (fake) cgroup.event_control."""
    match = re.fullmatch(r"(\d+) (\d+)", (directory / "cgroup.event_control").read_text())
    assert match, "no eventfd registered"
    return int(match[1])


def test_read_oom_kill_count(tmp_path: Path) -> None:
    directory = make_cgroup(tmp_path, "a", oom_kill=3)
    assert read_oom_kill_count(os.fsencode(directory)) == 3
    (directory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    assert read_oom_kill_count(os.fsencode(directory)) == 0, "old kernels do not count"
    assert read_oom_kill_count(os.fsencode(tmp_path / "gone")) is None


def test_register_writes_the_eventfd_and_control_fds(tmp_path: Path) -> None:
    directory = make_cgroup(tmp_path, "a")
    efd = register_oom_eventfd(os.fsencode(directory))
    try:
        assert registered_eventfd(directory) == efd
        os.eventfd_write(efd, 1)
        assert os.eventfd_read(efd) == 1
    finally:
        os.close(efd)
    with pytest.raises(FileNotFoundError):
        register_oom_eventfd(os.fsencode(tmp_path / "memory" / "k8s.io" / "gone"))


# -- the watcher ---------------------------------------------------------------------------------


class Listed:
    """The containers the runtime holds, handed over as the PLEG's relist hands them."""

    def __init__(self) -> None:
        self.containers: dict[str, tuple[str, RuntimeContainer]] = {}  # id -> (pod, container)

    def add(self, id: str, *, name: str = "app", pod: str = "web",
            state: ContainerState = ContainerState.RUNNING) -> None:
        self.containers[id] = (pod, RuntimeContainer(id=id, name=name, state=state))

    def exit(self, id: str) -> None:
        pod, container = self.containers[id]
        self.containers[id] = (pod, replace(container, state=ContainerState.EXITED))

    def pods(self) -> dict[str, RuntimePodStatus]:
        by_pod: dict[str, list[RuntimeContainer]] = {}
        for pod, container in self.containers.values():
            by_pod.setdefault(pod, []).append(container)
        return {f"uid-{pod}": RuntimePodStatus(uid=f"uid-{pod}", name=pod, namespace="prod",
                                               containers=tuple(containers))
                for pod, containers in by_pod.items()}


@dataclass
class Env:
    watcher: OOMWatcher
    listed: Listed
    events: trio.MemoryReceiveChannel[OOMEvent]
    root: Path
    kmsg: int | None
    published: list[Mapping[str, int]] = field(default_factory=list)

    async def relist(self) -> None:
        """What the PLEG does after a successful relist; returns once the watcher applied it."""
        self.watcher.update(self.listed.pods())
        await trio.testing.wait_all_tasks_blocked()

    def write_kmsg(self, data: bytes) -> None:
        assert self.kmsg is not None
        os.write(self.kmsg, data)

    async def next_event(self, timeout: float = 5.0) -> OOMEvent:
        with trio.fail_after(timeout):
            return await self.events.receive()

    async def no_event(self) -> None:
        await trio.sleep(3)  # past every re-check of the counter
        with pytest.raises(trio.WouldBlock):
            self.events.receive_nowait()


@pytest.fixture(params=["v1", "v2"])
def root(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A cgroup root, the v1 memory hierarchy's or the unified hierarchy's."""
    root = tmp_path / "cgroup"
    if request.param == "v2":
        root.mkdir()
        (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    else:
        (root / "memory").mkdir(parents=True)
    return root


@asynccontextmanager
async def watching(tmp_path: Path, root: Path, listed: Listed, *, kmsg: bool = True,
                   relisted: bool = True) -> AsyncIterator[Env]:
    """A running watcher; ``relisted``: given one relist already (the PLEG started first)."""
    fifo = tmp_path / "kmsg"
    writer = None
    if kmsg:
        os.mkfifo(fifo)
        writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that outlives the reader
    published: list[Mapping[str, int]] = []
    watcher = OOMWatcher(cgroup_root=root, kmsg=fifo if kmsg else None,
                         wall_clock=lambda: 1_700_000_000.0,
                         on_counts=lambda counts: published.append(dict(counts)),
                         offload=False)
    if relisted:
        watcher.update(listed.pods())
    send, receive = trio.open_memory_channel[OOMEvent](10)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run, send)
            await trio.testing.wait_all_tasks_blocked()
            yield Env(watcher, listed, receive, root, writer, published)
            nursery.cancel_scope.cancel()
    finally:
        if writer is not None:
            os.close(writer)


async def test_an_oom_in_a_watched_container_is_counted_and_sent(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock
) -> None:
    listed = Listed()
    listed.add(ID)
    directory = make_cgroup(root, ID)
    async with watching(tmp_path, root, listed, kmsg=False) as env:
        assert env.watcher.watched() == {ID}
        set_oom_kill(directory, 1)
        notify(directory)
        event = await env.next_event()
        assert event == OOMEvent(
            container_id=ID, pod_uid="uid-web", pod_name="web", pod_namespace="prod",
            container_name="app", time=1_700_000_000.0, count=1)
        assert env.watcher.counts == {ID: 1}
        assert env.published[-1] == {ID: 1}
        assert OOMEvent.model_validate_json(event.model_dump_json()) == event


async def test_containers_are_watched_from_the_relist_that_lists_them_to_the_one_that_does_not(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock
) -> None:
    listed = Listed()
    async with watching(tmp_path, root, listed, kmsg=False, relisted=False) as env:
        assert env.watcher.watched() == frozenset(), "nothing to arm before the first relist"
        make_cgroup(root, "a")
        make_cgroup(root, "b")
        listed.add("a")
        listed.add("b", pod="api")
        await env.relist()
        assert env.watcher.watched() == {"a", "b"}
        del listed.containers["a"]
        await env.relist()
        assert env.watcher.watched() == {"b"}


async def test_the_counter_is_rechecked_when_the_kernel_notifies_before_killing(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock
) -> None:
    listed = Listed()
    listed.add(ID)
    directory = make_cgroup(root, ID)
    async with watching(tmp_path, root, listed, kmsg=False) as env:
        notify(directory)
        await trio.sleep(0.05)
        set_oom_kill(directory, 1)  # the kill lands after the notification
        assert (await env.next_event()).count == 1


async def test_a_kill_seen_by_both_signals_is_counted_once(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock
) -> None:
    listed = Listed()
    listed.add(ID)
    directory = make_cgroup(root, ID)
    async with watching(tmp_path, root, listed) as env:
        env.write_kmsg(kill_records(ID, pid=42, task="dd"))
        event = await env.next_event()
        assert (event.count, event.process, event.pid) == (1, "dd", 42)
        set_oom_kill(directory, 1)
        notify(directory)
        await env.no_event()
        assert env.watcher.counts == {ID: 1}

        set_oom_kill(directory, 2)  # a second kill the log has not shown yet
        notify(directory)
        assert (await env.next_event()).count == 2
        env.write_kmsg(kill_records(ID))
        await env.no_event()


async def test_an_early_kill_is_counted_from_the_kernel_log_at_the_next_relist(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock
) -> None:
    listed = Listed()
    async with watching(tmp_path, root, listed, relisted=False) as env:
        env.write_kmsg(kill_records("new", pid=7))
        await env.no_event()  # a container no relist has named yet
        listed.add("new", name="oom", pod="job", state=ContainerState.EXITED)
        await env.relist()
        event = env.events.receive_nowait()  # at that relist, not a period later
        assert (event.container_id, event.pod_name, event.container_name) == ("new", "job", "oom")

        env.write_kmsg(kill_records("not-a-container"))
        await env.no_event()
        await env.relist()
        await env.no_event()
        assert env.watcher.counts == {"new": 1}


async def test_a_vanished_cgroup_ends_its_watch_quietly(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    listed = Listed()
    listed.add(ID)
    directory = make_cgroup(root, ID)
    v1 = (directory / "cgroup.event_control").exists()
    async with watching(tmp_path, root, listed, kmsg=False) as env:
        efd = registered_eventfd(directory) if v1 else -1
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
        if v1:
            os.eventfd_write(efd, 1)  # the kernel signals the removal too
            await env.no_event()
            assert env.watcher.watched() == frozenset()
        else:
            # kernfs sends nothing when a cgroup goes: the watch ends with the relist that
            # no longer shows the container running.
            await env.no_event()
            listed.exit(ID)
            await env.relist()
            assert env.watcher.watched() == frozenset()
        listed.containers.clear()
        await env.relist()
        assert env.watcher.counts == {}
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


async def test_counts_of_removed_containers_are_forgotten(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock
) -> None:
    listed = Listed()
    listed.add(ID)
    directory = make_cgroup(root, ID, oom_kill=0)
    async with watching(tmp_path, root, listed) as env:
        set_oom_kill(directory, 1)
        notify(directory)
        await env.next_event()
        listed.exit(ID)
        await env.relist()
        assert env.watcher.watched() == frozenset(), "an exited container is not watched"
        assert env.watcher.counts == {ID: 1}, "its count stays while the runtime has it"
        listed.containers.clear()
        await env.relist()
        assert env.watcher.counts == {}
        assert env.published[-1] == {}


async def test_a_container_that_already_had_kills_is_counted_on_registration(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock
) -> None:
    listed = Listed()
    listed.add(ID)
    make_cgroup(root, ID, oom_kill=2)
    async with watching(tmp_path, root, listed, kmsg=False) as env:
        assert (await env.next_event()).count == 2


async def test_without_an_inotify_instance_the_kernel_log_still_counts(
    tmp_path: Path, root: Path, autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    if not (root / "cgroup.controllers").exists():
        pytest.skip("inotify serves cgroup v2 only")

    def no_instances() -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr("trio_kubelet.sources.oom.Inotify", no_instances)
    listed = Listed()
    listed.add(ID)
    make_cgroup(root, ID)
    async with watching(tmp_path, root, listed) as env:
        assert env.watcher.watched() == frozenset()
        assert "Cannot watch memory.events" in caplog.text
        env.write_kmsg(kill_records(ID))
        assert (await env.next_event()).count == 1

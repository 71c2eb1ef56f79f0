"""sources.pleg: relisting the fake runtime on trio's (mock) clock and reporting changes,
with and without the runtime's container event stream."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core.observed import ContainerState, RuntimePodStatus
from trio_kubelet.events import ContainerEventStream, Event, PodLifecycleEvent, RelistDone
from trio_kubelet.model.pod import Pod
from trio_kubelet.runtime import configs
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError
from trio_kubelet.runtime.fake import ContainerScript, FakeRuntime, open_fake_runtime
from trio_kubelet.sources.pleg import run_pleg

T0 = 1_700_000_000.0
UID = "5f0c3b8e-1111-4000-8000-000000000001"
IMAGE = "busybox:1.36"


@dataclass
class Relist:
    """What one relist sent: its lifecycle events (as tuples) and its RelistDone."""

    events: list[tuple[str, str, str]]
    done: RelistDone


@dataclass
class Pleg:
    fake: FakeRuntime
    receive: trio.MemoryReceiveChannel[Event]
    #: What the PLEG said of the event stream, with the (virtual) time it said it.
    stream: list[tuple[float, str]] = field(default_factory=list)

    async def next_relist(self) -> Relist:
        events: list[tuple[str, str, str]] = []
        with trio.fail_after(5):  # virtual seconds: a PLEG that stops reporting fails fast
            async for event in self.receive:
                if isinstance(event, RelistDone):
                    return Relist(events, event)
                if isinstance(event, ContainerEventStream):
                    self.stream.append((trio.current_time(), event.state))
                    continue
                assert isinstance(event, PodLifecycleEvent)
                events.append((event.pod_uid, event.type, event.container_id))
        raise AssertionError("PLEG stopped")


@asynccontextmanager
async def running_pleg(
    tmp_path: Path,
    on_relist: Callable[[Mapping[str, RuntimePodStatus]], None] | None = None,
    *,
    event_stream: bool = False,
) -> AsyncIterator[Pleg]:
    wall = TrioWallClock(epoch=T0)
    runtime = FakeRuntime(wall.now, event_stream=event_stream)
    async with open_fake_runtime(runtime, timeout=5.0) as (fake, client):
        fake.add_image(IMAGE)
        # Unbounded, so reading late never delays a relist and relist times stay exact.
        send, receive = trio.open_memory_channel[Event](math.inf)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(run_pleg, send, client, on_relist=on_relist))
            yield Pleg(fake, receive)
            nursery.cancel_scope.cancel()


POD = Pod.model_validate({
    "metadata": {"name": "web", "namespace": "default", "uid": UID},
    "spec": {"containers": [{"name": name, "image": IMAGE} for name in ("a", "b", "c", "d")]},
})


def run_sandbox(fake: FakeRuntime, tmp_path: Path) -> tuple[str, v1.PodSandboxConfig]:
    """Create the pod's sandbox straight on the fake (not through the served API)."""
    config = configs.sandbox_config(POD, 0, tmp_path / "logs")
    request = v1.RunPodSandboxRequest(config=config)
    return str(fake.run_pod_sandbox(request).pod_sandbox_id), config


def run_container(fake: FakeRuntime, sandbox: tuple[str, v1.PodSandboxConfig], name: str) -> str:
    sandbox_id, sandbox_config = sandbox
    container = next(c for c in POD.spec.containers if c.name == name)
    config = configs.container_config(POD, container, kind="regular", image_ref=IMAGE,
                                      restart_count=0)
    container_id = fake.create_container(v1.CreateContainerRequest(
        pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config)).container_id
    fake.start_container(v1.StartContainerRequest(container_id=container_id))
    return str(container_id)


async def test_first_relist_reports_what_runs_and_a_scripted_exit_is_reported(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_pleg(tmp_path) as pleg:
        pleg.fake.script("web", "a", ContainerScript(exit_after=1.5, exit_code=3))
        sandbox = run_sandbox(pleg.fake, tmp_path)
        a = run_container(pleg.fake, sandbox, "a")
        start = trio.current_time()

        first = await pleg.next_relist()
        assert first.done.ok
        assert sorted(first.events) == sorted([
            (UID, "ContainerStarted", sandbox[0]),
            (UID, "ContainerStarted", a),
        ])
        second = await pleg.next_relist()  # at 1 s: nothing changed yet
        assert (second.events, trio.current_time() - start) == ([], 1.0)
        third = await pleg.next_relist()  # at 2 s: exited at 1.5 s
        assert third.events == [(UID, "ContainerDied", a)]
        assert trio.current_time() - start == 2.0
        assert (await pleg.next_relist()).events == []
        # Two list calls per relist, nothing else: relisting is the hot path.
        assert pleg.fake.calls["ListPodSandbox"] == pleg.fake.calls["ListContainers"] == 4
        assert pleg.fake.calls["ContainerStatus"] == 0


async def test_changes_hidden_by_an_outage_are_reported_after_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_kubelet.pleg")
    async with running_pleg(tmp_path) as pleg:
        fake = pleg.fake
        sandbox = run_sandbox(fake, tmp_path)
        a, b, c = (run_container(fake, sandbox, name) for name in "abc")
        assert (await pleg.next_relist()).done.ok

        fake.set_unavailable(True)
        fake.crash(a, exit_code=1)  # the fake's own API works during the outage
        fake.stop_container(v1.StopContainerRequest(container_id=b, timeout=0))
        fake.remove_container(v1.RemoveContainerRequest(container_id=b))
        fake.stop_container(v1.StopContainerRequest(container_id=c, timeout=0))
        d = run_container(fake, sandbox, "d")
        for _ in range(2):
            failed = await pleg.next_relist()
            assert failed.events == []
            assert not failed.done.ok
            assert "UNAVAILABLE" in failed.done.error

        fake.set_unavailable(False)
        recovered = await pleg.next_relist()
        assert recovered.done.ok
        assert sorted(recovered.events) == sorted([
            (UID, "ContainerDied", a),
            (UID, "ContainerDied", b),
            (UID, "ContainerRemoved", b),
            (UID, "ContainerDied", c),
            (UID, "ContainerStarted", d),
        ])
        # Died comes before Removed for the same container.
        kinds_of_b = [kind for _, kind, cid in recovered.events if cid == b]
        assert kinds_of_b == ["ContainerDied", "ContainerRemoved"]
        assert (await pleg.next_relist()).events == []

    messages = [r.getMessage() for r in caplog.records]
    assert sum("PLEG relist failed" in m for m in messages) == 1, "one warning per outage"
    assert sum("PLEG relist recovered" in m for m in messages) == 1


async def test_relists_keep_their_period_when_the_runtime_is_slow(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with running_pleg(tmp_path) as pleg:
        pleg.fake.set_delay("ListContainers", 0.25)
        start = trio.current_time()
        durations = []
        for _ in range(3):
            durations.append((await pleg.next_relist()).done.duration)
        # Relists start every second; each reports how long its calls took.
        assert trio.current_time() - start == pytest.approx(2.25)
        assert durations == [pytest.approx(0.25)] * 3


async def test_each_successful_relist_is_handed_to_on_relist_without_listing_again(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    relists: list[Mapping[str, RuntimePodStatus]] = []
    async with running_pleg(tmp_path, on_relist=relists.append) as pleg:
        fake = pleg.fake
        sandbox = run_sandbox(fake, tmp_path)
        a = run_container(fake, sandbox, "a")
        await pleg.next_relist()
        (pod,) = relists[0].values()
        assert (pod.uid, pod.name, pod.namespace) == (UID, "web", "default")
        assert [(c.id, c.name, c.state) for c in pod.containers] == [
            (a, "a", ContainerState.RUNNING)]

        fake.set_unavailable(True)
        assert not (await pleg.next_relist()).done.ok
        assert len(relists) == 1, "a failed relist hands nothing over"
        fake.set_unavailable(False)
        fake.crash(a, exit_code=1)
        await pleg.next_relist()
        assert [c.state for c in relists[-1][UID].containers] == [ContainerState.EXITED]
        assert len(relists) == 2
        # The subscriber lists nothing: the two successful relists' calls are all there is.
        assert fake.calls["ListContainers"] == 2


# -- with the runtime's container event stream (containerd 2.x) ---------------------------------


@dataclass
class Told:
    """Everything a PLEG sent, with the virtual time it sent it."""

    fake: FakeRuntime
    log: list[tuple[float, Event]] = field(default_factory=list)

    def changes(self, since: float = -math.inf) -> list[tuple[str, str, str]]:
        """(type, container id, via) of every lifecycle event sent at or after ``since``."""
        return [(e.type, e.container_id, e.via) for t, e in self.log
                if isinstance(e, PodLifecycleEvent) and t >= since]

    def relists(self) -> list[float]:
        return [t for t, e in self.log if isinstance(e, RelistDone)]

    def stream(self) -> list[tuple[float, str]]:
        return [(t, e.state) for t, e in self.log if isinstance(e, ContainerEventStream)]


@asynccontextmanager
async def told_by_pleg(event_stream: bool = True) -> AsyncIterator[Told]:
    wall = TrioWallClock(epoch=T0)
    async with open_fake_runtime(FakeRuntime(wall.now, event_stream=event_stream),
                                 timeout=5.0) as (fake, client):
        fake.add_image(IMAGE)
        told = Told(fake)
        send, receive = trio.open_memory_channel[Event](math.inf)

        async def collect() -> None:
            async for event in receive:
                told.log.append((trio.current_time(), event))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_pleg, send, client)
            nursery.start_soon(collect)
            yield told
            nursery.cancel_scope.cancel()


def each_once(changes: list[tuple[str, str, str]]) -> bool:
    kinds = [(kind, cid) for kind, cid, _ in changes]
    return len(kinds) == len(set(kinds))


async def test_the_stream_tells_a_change_when_it_happens_and_relists_do_not_repeat_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with told_by_pleg() as told:
        fake = told.fake
        await trio.sleep(5)  # the stream is proven open (one relist period) and quiet
        fake.script("web", "a", ContainerScript(exit_after=2.5, exit_code=3))
        start = trio.current_time()
        sandbox = run_sandbox(fake, tmp_path)
        a = run_container(fake, sandbox, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert told.changes(start) == [("ContainerStarted", sandbox[0], "stream"),
                                       ("ContainerStarted", a, "stream")]
        await trio.sleep(2.6)
        died_at = next(t for t, e in told.log if isinstance(e, PodLifecycleEvent)
                       and e.type == "ContainerDied")
        assert died_at == start + 2.5, "told at the scripted exit, not at a relist"
        await trio.sleep(60)
        assert told.changes(start)[2:] == [("ContainerDied", a, "stream")]
        assert each_once(told.changes())
    assert told.stream() == [(1.0, "open")]


async def test_a_quiet_stream_relists_every_30s_and_one_second_after_a_change(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with told_by_pleg() as told:
        await trio.sleep(70)
        # 0 (before the stream was open), 1 (proves it), then the quiet period.
        assert told.relists() == [0.0, 1.0, 31.0, 61.0]
        run_sandbox(told.fake, tmp_path)
        await trio.testing.wait_all_tasks_blocked()
        changed = trio.current_time()
        await trio.sleep(40)
        assert told.relists()[4:] == [changed + 1.0, changed + 31.0]
        assert [via for _, _, via in told.changes()] == ["stream"]


async def test_a_runtime_without_the_stream_relists_every_second_as_before(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with told_by_pleg(event_stream=False) as told:
        sandbox = run_sandbox(told.fake, tmp_path)
        await trio.sleep(310.5)
        assert told.relists() == [float(t) for t in range(311)]
        assert told.changes() == [("ContainerStarted", sandbox[0], "relist")]
        # Said once; asked again after 5 minutes (the runtime may have been upgraded).
        assert told.stream() == [(0.0, "unsupported")]
        assert told.fake.calls["GetContainerEvents"] == 2


async def test_changes_while_the_stream_is_broken_are_told_once_after_it(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trio_kubelet.pleg")
    async with told_by_pleg() as told:
        fake = told.fake
        sandbox = run_sandbox(fake, tmp_path)
        a, b, c = (run_container(fake, sandbox, name) for name in "abc")
        await trio.sleep(40)
        fake.drop_event_streams()
        await trio.testing.wait_all_tasks_blocked()
        broken = trio.current_time()
        # While no stream is open (it is reopened after 1 s): a dies, b goes.
        fake.crash(a, exit_code=1)
        fake.stop_container(v1.StopContainerRequest(container_id=b, timeout=0))
        fake.remove_container(v1.RemoveContainerRequest(container_id=b))
        await trio.sleep(1.5)
        fake.crash(c, exit_code=2)  # on the new stream
        await trio.sleep(60)

        after = told.changes(broken)
        assert sorted(after) == sorted([("ContainerDied", a, "relist"),
                                        ("ContainerDied", b, "relist"),
                                        ("ContainerRemoved", b, "relist"),
                                        ("ContainerDied", c, "stream")])
        assert each_once(told.changes())
        # At once when the stream broke, every second until the reopened stream (at +1 s)
        # proved itself (its first event, at +1.5 s), then quiet again.
        assert [t - broken for t in told.relists() if broken <= t] == [0.0, 1.0, 2.0, 32.0]
        assert told.stream() == [(1.0, "open"), (broken, "closed"), (broken + 1.5, "open")]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("Container event stream lost" in m for m in messages) == 1


async def test_an_outage_breaks_the_stream_and_the_changes_it_hid_are_told_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with told_by_pleg() as told:
        fake = told.fake
        sandbox = run_sandbox(fake, tmp_path)
        a = run_container(fake, sandbox, "a")
        await trio.sleep(40)
        fake.set_unavailable(True)
        fake.crash(a, exit_code=1)
        await trio.sleep(0.5)
        down = trio.current_time()
        await trio.sleep(20)
        assert told.changes(down) == []
        fake.set_unavailable(False)
        up = trio.current_time()
        await trio.sleep(60)
        assert told.changes(up) == [("ContainerDied", a, "relist")]
        assert each_once(told.changes())
        # Opened, then tried again 1, 2, 4 and 8 s apart while the outage lasted; the
        # 16 s wait after that ended after it.
        assert fake.calls["GetContainerEvents"] == 6
        assert [state for _, state in told.stream()] == ["open", "closed", "open"]


async def test_a_failed_start_has_no_event_and_is_told_by_the_relist_a_second_later(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with told_by_pleg() as told:
        fake = told.fake
        await trio.sleep(40)
        fake.script("web", "a", ContainerScript(fail_start="exec: no such file"))
        sandbox = run_sandbox(fake, tmp_path)
        created = trio.current_time()
        with pytest.raises(CRIError):
            run_container(fake, sandbox, "a")
        (a,) = fake.container_ids()
        await trio.sleep(5)
        died = [(t, kind, cid, via) for t, e in told.log if isinstance(e, PodLifecycleEvent)
                for kind, cid, via in [(e.type, e.container_id, e.via)] if cid == a]
        assert died == [(created + 1.0, "ContainerDied", a, "relist")]


async def test_a_failed_relist_is_retried_a_second_later_even_while_the_stream_is_up(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    async with told_by_pleg() as told:
        await trio.sleep(5)
        told.fake.set_delay("ListContainers", 10)  # past the client's 5 s deadline
        await trio.sleep(40)
        told.fake.set_delay("ListContainers", 0)
        await trio.sleep(60)
    done = [(t, e.ok) for t, e in told.log if isinstance(e, RelistDone)]
    # (When each relist ended.) Quiet until the one begun at 31 s, which waits out its 5 s
    # deadline; each failure is retried at once (a period after it began) until the delay
    # is gone at 45 s; then quiet again.
    assert done == [(0.0, True), (1.0, True), (36.0, False), (41.0, False), (46.0, False),
                    (46.0, True), (76.0, True)]

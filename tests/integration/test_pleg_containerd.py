"""The PLEG on a real containerd: its container event stream on 2.x, relists alone on 1.6.

Run on both (`nox -s integration_containerd2` runs this module on containerd 2.x): what each
test expects of the event stream follows from the runtime it finds.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from google.protobuf.json_format import MessageToDict

from tests.integration.harness import RunningAgent, container, running, running_agent
from trio_kubelet.core.container_ids import runtime_id
from trio_kubelet.events import EVENT_ADAPTER, ContainerEventStream, Event, PodLifecycleEvent
from trio_kubelet.model.pod import Pod
from trio_kubelet.recording.records import EventRecord
from trio_kubelet.replay.reader import read_recording
from trio_kubelet.replay.replayer import replay
from trio_kubelet.runtime import configs, labels
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.errors import CRIUnimplemented

pytestmark = pytest.mark.integration

SLEEPER = """\
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
"""


@contextmanager
def told(agent: RunningAgent) -> Iterator[list[tuple[float, Event]]]:
    """Every event the agent's sync loop handles from now on, with its trio time."""
    log: list[tuple[float, Event]] = []
    handle = agent.loop.handle

    def recording(event: Event) -> None:
        log.append((trio.current_time(), event))
        handle(event)

    agent.loop.handle = recording  # type: ignore[method-assign]
    try:
        yield log
    finally:
        agent.loop.handle = handle  # type: ignore[method-assign]


def lifecycle(log: list[tuple[float, Event]], container_id: str) -> list[tuple[str, str]]:
    return [(e.type, e.via) for _, e in log
            if isinstance(e, PodLifecycleEvent) and e.container_id == container_id]


def after_start(told: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """What was told of a container after its start (which the log may or may not hold:
    the agent can report the pod running before the PLEG hears of its start)."""
    return told[1:] if told[:1] and told[0][0] == "ContainerStarted" else told


def stream_states(log: list[tuple[float, Event]]) -> list[str]:
    return [e.state for _, e in log if isinstance(e, ContainerEventStream)]


async def kill_main(containerd: Any, agent: RunningAgent, name: str) -> tuple[str, float]:
    """SIGKILL the pod's running main container behind the agent's back: its id and when."""
    pod = await agent.wait_for(name, lambda p: running(p, "main"))
    container_id = runtime_id(container(pod, "main").container_id or "")
    killed = trio.current_time()
    await trio.to_thread.run_sync(containerd.ctr, "tasks", "kill", "-s", "SIGKILL",
                                  container_id)
    return container_id, killed


async def test_a_killed_container_is_told_once_and_replaced(containerd, tmp_path):
    evented = containerd.major >= 2
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("web.yaml", SLEEPER.format(name="web"))
        await agent.wait_for("web", lambda p: running(p, "main"))
        with told(agent) as log:
            await trio.sleep(2.5)  # the stream proves itself (one relist period)
            first, killed = await kill_main(containerd, agent, "web")
            await agent.wait_for("web", lambda p: running(p, "main")
                                 and container(p, "main").restart_count == 1)
            await trio.sleep(3)  # relists after the change: none may tell it again

        assert after_start(lifecycle(log, first)) == [
            ("ContainerDied", "stream" if evented else "relist")]
        died_at = next(t for t, e in log if isinstance(e, PodLifecycleEvent)
                       and e.container_id == first)
        # containerd 2 sends the event ~0.1 s after the kill; a relist comes within 1 s. The
        # claim is `via` above; this is a sanity bound (``killed`` is taken before ``ctr`` is
        # spawned, and a loaded CI box adds to both), the latency itself is bench_kill_restart's.
        assert died_at - killed < (2.0 if evented else 3.0)
    assert stream_states(log) == []  # nothing new about the stream itself


async def test_the_recording_shows_the_stream_and_what_it_told(containerd, tmp_path):
    recording = tmp_path / "agent.jsonl"
    async with running_agent(containerd.endpoint, tmp_path, "--record", str(recording)) as agent:
        agent.write("web.yaml", SLEEPER.format(name="web"))
        await agent.wait_for("web", lambda p: running(p, "main"))
        await trio.sleep(2.5)
        first, _ = await kill_main(containerd, agent, "web")
        await agent.wait_for("web", lambda p: running(p, "main")
                             and container(p, "main").restart_count == 1)
    records = read_recording(recording).records
    log = [(0.0, EVENT_ADAPTER.validate_python(r.record.event)) for r in records
           if isinstance(r.record, EventRecord)]
    evented = containerd.major >= 2
    assert stream_states(log) == (["open"] if evented else ["unsupported"])
    assert after_start(lifecycle(log, first)) == [
        ("ContainerDied", "stream" if evented else "relist")]
    result = replay(records)
    assert result.divergence is None, result.divergence and result.divergence.diff
    assert result.decisions > 0


async def test_a_runtime_restart_loses_and_repeats_nothing(containerd, tmp_path):
    if containerd.major < 2:
        pytest.skip("containerd 1.6 has no event stream to reconnect")
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("web.yaml", SLEEPER.format(name="web"))
        await agent.wait_for("web", lambda p: running(p, "main"))
        with told(agent) as log:
            await trio.sleep(2.5)
            await trio.to_thread.run_sync(containerd.stop_daemon)
            await trio.sleep(2)
            await trio.to_thread.run_sync(containerd.start_daemon)
            # Reopened with backoff (1, 2, 4 s ...), proven one period later.
            with trio.fail_after(30):
                while stream_states(log)[-1:] != ["open"]:
                    await trio.sleep(0.2)
            first, _ = await kill_main(containerd, agent, "web")
            await agent.wait_for("web", lambda p: container(p, "main").restart_count == 1
                                 and running(p, "main"))
            await trio.sleep(3)
        assert stream_states(log) == ["closed", "open"]
        assert after_start(lifecycle(log, first)) == [("ContainerDied", "stream")]


POD = Pod.model_validate({
    "metadata": {"name": "probe", "namespace": "default", "uid": "uid-pleg-probe"},
    "spec": {"containers": [{"name": "app", "image": "busybox:1.36",
                             "command": ["sleep", "3600"]}]},
})


def described(message: Any) -> tuple[str, str, str, list[str]]:
    """(type, object id, the carried sandbox's pod UID, the carried container ids): the same
    reading of an event as tests/unit/test_runtime_fake.py's of the fake's."""
    data = MessageToDict(message, always_print_fields_with_no_presence=True)
    sandbox = data.get("podSandboxStatus")
    uid = sandbox["labels"].get(labels.POD_UID, "") if sandbox else "-"
    return (data["containerEventType"], data["containerId"], uid,
            sorted(c["id"] for c in data["containersStatuses"]))


async def ours(events: Any, count: int) -> list[tuple[str, str, str, list[str]]]:
    """The next ``count`` events about this test's pod (the previous test's cleanup may
    still be telling of its own)."""
    seen: list[tuple[str, str, str, list[str]]] = []
    while len(seen) < count:
        event = described(await events.__anext__())
        if event[2] == POD.metadata.uid:
            seen.append(event)
    return seen


async def test_containerd_sends_what_the_fake_sends(containerd):
    """The fake runtime's event stream is modelled on this: keep the two in step."""
    logs = Path(tempfile.mkdtemp(prefix="tk-pleg-"))
    sandbox_config = configs.sandbox_config(POD, 0, logs)
    container_config = configs.container_config(
        POD, POD.spec.containers[0], kind="regular", image_ref=containerd.BUSYBOX_TAGGED,
        restart_count=0)
    async with open_cri_client(containerd.endpoint, timeout=30) as client:
        with trio.fail_after(60):
            async with client.container_events() as events:
                if containerd.major < 2:
                    with pytest.raises(CRIUnimplemented):
                        await events.__anext__()
                    return
                await trio.sleep(0.5)  # the runtime subscribes the stream
                sandbox = await client.run_pod_sandbox(sandbox_config)
                app = await client.create_container(sandbox, container_config, sandbox_config)
                await client.start_container(app)
                await trio.to_thread.run_sync(containerd.ctr, "tasks", "kill", "-s", "SIGKILL",
                                              app)
                seen = await ours(events, 5)
                await client.remove_pod_sandbox(sandbox)
                seen += await ours(events, 3)
    uid = POD.metadata.uid
    assert seen == [
        ("CONTAINER_CREATED_EVENT", sandbox, uid, []),
        ("CONTAINER_STARTED_EVENT", sandbox, uid, []),
        ("CONTAINER_CREATED_EVENT", app, uid, [app]),
        ("CONTAINER_STARTED_EVENT", app, uid, [app]),
        ("CONTAINER_STOPPED_EVENT", app, uid, [app]),
        ("CONTAINER_STOPPED_EVENT", sandbox, uid, [app]),
        ("CONTAINER_DELETED_EVENT", app, uid, []),
        ("CONTAINER_DELETED_EVENT", sandbox, uid, []),
    ]

"""Eviction and allocatable enforcement on containerd, with the agent in-process.

Static pods are never evicted, so the pods here come in as the API source's would,
straight into the sync loop. The memory threshold is placed from what the machine has
available when the test starts, so the test works whatever the machine's size. Each
agent gets a cgroup root of its own: another agent on the machine (a test running
beside this one) would otherwise share kubepods, take these pods' cgroups for orphans
and kill them, and see its own kubepods limits changed. The cgroup files checked are
those of the hierarchy the machine boots (`cgroup_files.MODE`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from tests.integration.cgroup_files import (
    CGROUPS,
    V2,
    go_cpu_weight,
    has_controllers,
    hierarchies,
    read,
)
from tests.integration.harness import RunningAgent, running, running_agent
from trio_kubelet import agent as agent_module
from trio_kubelet.events import PodSetUpdate
from trio_kubelet.model.pod import Pod
from trio_kubelet.node.machine import read_machine_facts
from trio_kubelet.resources.cgroupfs import CgroupRoots, read_cgroup
from trio_kubelet.sources.sampler import read_machine_info

pytestmark = pytest.mark.integration

MiB = 1 << 20
HOG = 1024 * MiB  # what the hog holds once triggered
MARGIN = 400 * MiB  # the threshold sits this far below what is available at the start
INTERVAL = 2.0  # sampler and eviction rounds, instead of 10 s

if not has_controllers("cpu", "memory"):
    pytest.skip("the cgroup cpu and memory controllers are needed", allow_module_level=True)


@pytest.fixture(autouse=True)
def quick_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_module, "HOUSEKEEPING_INTERVAL", INTERVAL)
    monkeypatch.setattr(agent_module, "EVICTION_MONITORING_INTERVAL", INTERVAL)


@pytest.fixture
def cgroup_root() -> Iterator[str]:
    """A cgroup root (``--cgroup-root``) of this test's own, removed afterwards."""
    name = f"trio-itest-{uuid.uuid4().hex[:8]}"
    made = []
    for hierarchy in hierarchies():
        with contextlib.suppress(OSError):
            (hierarchy / name).mkdir()
            made.append(hierarchy / name)
    yield f"/{name}"
    for top in made:
        for directory, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def memory_available() -> int:
    """memory.available as the eviction manager computes it: capacity less the root working set
    (on v2 the root's memory.stat anon + file, less inactive_file)."""
    root = read_cgroup(CgroupRoots.under(CGROUPS), b"")
    assert root is not None and root.memory_working_set_bytes is not None
    return read_machine_info().memory_capacity_bytes - root.memory_working_set_bytes


def api_pod(name: str, command: str, *, memory_request: str | None = None,
            trigger: Path | None = None) -> Pod:
    container: dict[str, object] = {
        "name": name, "image": "busybox:1.36", "command": ["sh", "-c", command],
    }
    spec: dict[str, object] = {"terminationGracePeriodSeconds": 2, "containers": [container]}
    if memory_request is not None:
        container["resources"] = {"requests": {"memory": memory_request}}
    if trigger is not None:
        container["volumeMounts"] = [{"name": "trigger", "mountPath": "/trigger"}]
        spec["volumes"] = [{"name": "trigger", "hostPath": {"path": str(trigger)}}]
    return Pod.model_validate({
        "metadata": {
            "name": name, "namespace": "default", "uid": str(uuid.uuid4()),
            "annotations": {"kubernetes.io/config.source": "api"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
    })


async def wait_for(agent: RunningAgent, pod: Pod, predicate: Callable[[Pod], bool],
                   timeout: float = 60.0) -> Pod:
    uid = pod.metadata.uid
    with trio.move_on_after(timeout):
        while True:
            current = agent.store.get(uid)
            if current is not None and predicate(current):
                return current
            await agent.store.wait_changed()
    current = agent.store.get(uid)
    raise AssertionError(
        f"pod {pod.metadata.name} did not reach the expected state in {timeout}s; last status: "
        f"{current.status.model_dump_json(by_alias=True, exclude_none=True) if current else None}"
    )


def evicted(pod: Pod) -> bool:
    return pod.status.phase == "Failed" and pod.status.reason == "Evicted"


async def test_a_memory_hog_is_evicted_and_a_well_behaved_pod_keeps_running(
    containerd, tmp_path: Path, cgroup_root: str  # type: ignore[no-untyped-def]
) -> None:
    available = memory_available()
    if available < HOG + 2 * MARGIN:
        pytest.skip(f"only {available // MiB} MiB available; the hog needs room")
    threshold = (available - MARGIN) // MiB
    trigger = tmp_path / "trigger"
    trigger.mkdir()
    good = api_pod("good", "sleep 3600", memory_request="64Mi")
    # Holds HOG bytes in tail's line buffer once /trigger/go exists; no request at all.
    hog = api_pod("hog", (
        "while [ ! -e /trigger/go ]; do sleep 0.2; done; "
        f"{{ dd if=/dev/zero bs=1M count={HOG // MiB} 2>/dev/null; sleep 3600; }} | tail"
    ), trigger=trigger)
    flags = ("--eviction-hard", f"memory.available<{threshold}Mi", "--cgroup-root", cgroup_root)
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        agent.loop.handle(PodSetUpdate(source="api", pods=[good, hog]))
        await wait_for(agent, good, lambda p: running(p, "good"))
        await wait_for(agent, hog, lambda p: running(p, "hog"))

        # Below the threshold nothing happens, round after round.
        await trio.sleep(4 * INTERVAL)
        assert agent.loop.node_conditions() == ()
        assert not evicted(agent.store.get(hog.metadata.uid))  # type: ignore[arg-type]
        assert not evicted(agent.store.get(good.metadata.uid))  # type: ignore[arg-type]

        (trigger / "go").touch()
        gone = await wait_for(agent, hog, evicted, timeout=90)

        message = gone.status.message or ""
        assert message.startswith(
            f"The node was low on resource: memory. Threshold quantity: {threshold}Mi, "
        ), message
        assert "Container hog was using" in message and "request is 0" in message
        assert any(c.type == "DisruptionTarget" for c in gone.status.conditions)
        stopped = await wait_for(agent, hog, lambda p: not running(p, "hog"), timeout=30)
        assert stopped.status.phase == "Failed"
        assert agent.loop.node_conditions() == ("MemoryPressure",)

        # Pressure holds for the transition period: new BestEffort pods are refused...
        late = api_pod("late", "sleep 3600")
        agent.loop.handle(PodSetUpdate(source="api", pods=[good, hog, late]))
        refused = await wait_for(agent, late, lambda p: p.status.phase == "Failed")
        assert (refused.status.reason, refused.status.message) == (
            "Evicted", "Pod was rejected: The node had condition: [MemoryPressure]. ")
        # ...while the pod within its request was never touched.
        await trio.sleep(3 * INTERVAL)
        still = agent.store.get(good.metadata.uid)
        assert still is not None and running(still, "good") and not evicted(still)
        assert still.status.container_statuses[0].restart_count == 0

        agent.loop.handle(PodSetUpdate(source="api", pods=[]))
        for pod in (good, hog, late):
            with trio.fail_after(60):
                while agent.store.get(pod.metadata.uid) is not None:
                    await agent.store.wait_changed()


async def test_kubepods_is_held_to_allocatable_without_the_eviction_margin(
    containerd, tmp_path: Path, cgroup_root: str  # type: ignore[no-untyped-def]
) -> None:
    kubepods = (cgroup_root.strip("/"), "kubepods")
    machine = read_machine_facts(tmp_path)
    flags = ("--kube-reserved", "cpu=100m,memory=96Mi", "--system-reserved", "memory=32Mi",
             "--eviction-hard", "memory.available<300Mi", "--cgroup-root", cgroup_root)
    async with running_agent(containerd.endpoint, tmp_path, *flags):
        limit, cpu = kubepods_limits(kubepods)
    # Reserved memory is held back; the eviction threshold is not (eviction keeps it).
    assert limit == machine.memory_bytes - 128 * MiB
    assert cpu == cpu_setting((machine.num_cores * 1000 - 100) * 1024 // 1000)

    (tmp_path / "off").mkdir()
    async with running_agent(containerd.endpoint, tmp_path / "off",
                             "--enforce-node-allocatable", "none", *flags):
        # Not enforced: kubepods gets the whole machine.
        assert kubepods_limits(kubepods) == (
            machine.memory_bytes, cpu_setting(machine.num_cores * 1024))


def kubepods_limits(kubepods: tuple[str, ...]) -> tuple[int, int]:
    """kubepods' memory limit and cpu shares (v1) or weight (v2)."""
    if V2:
        return int(read("memory", *kubepods, "memory.max")), int(
            read("cpu", *kubepods, "cpu.weight"))
    return int(read("memory", *kubepods, "memory.limit_in_bytes")), int(
        read("cpu", *kubepods, "cpu.shares"))


def cpu_setting(shares: int) -> int:
    """What kubepods' cpu file holds for these shares in this mode."""
    return go_cpu_weight(shares) if V2 else shares


def storage_pod(name: str, command: str, *, size_limit: str | None = None,
                storage_limit: str | None = None) -> Pod:
    """A pod running ``command`` with an emptyDir at /scratch (``size_limit``) and an
    ephemeral-storage limit on its container (``storage_limit``)."""
    container: dict[str, object] = {
        "name": name, "image": "busybox:1.36", "command": ["sh", "-c", command],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    if storage_limit is not None:
        container["resources"] = {"limits": {"ephemeral-storage": storage_limit}}
    scratch = {} if size_limit is None else {"sizeLimit": size_limit}
    return Pod.model_validate({
        "metadata": {
            "name": name, "namespace": "default", "uid": str(uuid.uuid4()),
            "annotations": {"kubernetes.io/config.source": "api"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [container],
                 "volumes": [{"name": "scratch", "emptyDir": scratch}]},
    })


async def test_pods_past_their_own_local_storage_limits_are_evicted_and_others_kept(
    containerd, tmp_path: Path, cgroup_root: str,  # type: ignore[no-untyped-def]
) -> None:
    write = "dd if=/dev/zero of={} bs=1M count={} 2>/dev/null; sleep 3600"
    # 3 MiB into an emptyDir of 1Mi; 3 MiB into the writable layer past a 2Mi limit; and
    # 3 MiB into an emptyDir of 64Mi under a 256Mi limit, which is within both.
    scratch = storage_pod("scratch", write.format("/scratch/fill", 3), size_limit="1Mi")
    layer = storage_pod("layer", write.format("/fill", 3), storage_limit="2Mi")
    calm = storage_pod("calm", write.format("/scratch/fill", 3), size_limit="64Mi",
                       storage_limit="256Mi")
    async with running_agent(containerd.endpoint, tmp_path, "--cgroup-root", cgroup_root,
                             "--eviction-hard", "memory.available<1Mi",
                             "--volume-stats-agg-period", "1s") as agent:
        agent.loop.handle(PodSetUpdate(source="api", pods=[scratch, layer, calm]))

        gone = await wait_for(agent, scratch, evicted, timeout=90)
        assert gone.status.message == (
            'Usage of EmptyDir volume "scratch" exceeds the limit "1Mi". ')
        gone = await wait_for(agent, layer, evicted, timeout=90)
        # The pod's limit is its one container's, so the pod-wide check speaks first (as Go's).
        assert gone.status.message == (
            "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. ")
        for pod, name in ((scratch, "scratch"), (layer, "layer")):
            stopped = await wait_for(agent, pod, lambda p, n=name: not running(p, n), timeout=30)
            assert stopped.status.phase == "Failed"

        await trio.sleep(3 * INTERVAL)
        still = agent.store.get(calm.metadata.uid)
        assert still is not None and running(still, "calm") and not evicted(still)
        assert agent.loop.node_conditions() == ()

        agent.loop.handle(PodSetUpdate(source="api", pods=[]))
        for pod in (scratch, layer, calm):
            with trio.fail_after(60):
                while agent.store.get(pod.metadata.uid) is not None:
                    await agent.store.wait_changed()

"""Container GC on a real containerd: a crash loop's old instances go, the previous one stays
(``logs --previous`` works), and nothing of a removed pod is left."""

from __future__ import annotations

import uuid

import httpx
import pytest
import trio
from cri_api.v1 import api_pb2

from tests.integration.harness import container, running, running_agent
from tests.net import free_port
from trio_kubelet import agent as agent_module
from trio_kubelet.replay.reader import read_recording
from trio_kubelet.replay.replayer import replay
from trio_kubelet.runtime import labels

pytestmark = pytest.mark.integration

GC_PERIOD = 2.0

# Fails three times, then runs: instances 0-2 exit 1, instance 3 sleeps. The count survives
# restarts in an emptyDir.
CRASH = """\
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes: [{name: state, emptyDir: {}}]
  containers:
  - name: main
    image: busybox:1.36
    volumeMounts: [{name: state, mountPath: /state}]
    command:
    - sh
    - -c
    - |
      n=$(( $(cat /state/n 2>/dev/null || echo 0) + 1 )); echo $n > /state/n
      echo "run $n"
      if [ $n -ge 4 ]; then exec sleep 3600; fi
      exit 1
"""


def cri_containers(containerd, uid: str) -> list[api_pb2.Container]:
    request = api_pb2.ListContainersRequest(
        filter=api_pb2.ContainerFilter(label_selector={labels.POD_UID: uid})
    )
    return sorted(containerd.runtime_service.ListContainers(request, timeout=30).containers,
                  key=lambda c: c.created_at)


def cri_sandboxes(containerd, uid: str) -> list[api_pb2.PodSandbox]:
    request = api_pb2.ListPodSandboxRequest(
        filter=api_pb2.PodSandboxFilter(label_selector={labels.POD_UID: uid})
    )
    return list(containerd.runtime_service.ListPodSandbox(request, timeout=30).items)


async def wait_until(condition, timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not condition():
            await trio.sleep(0.5)
        return
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def test_container_gc_keeps_the_previous_instance_and_cleans_up_after_the_pod(
    containerd, tmp_path, monkeypatch
):
    monkeypatch.setattr(agent_module, "CONTAINER_GC_PERIOD", GC_PERIOD)
    port = free_port()
    # No pod cgroups: with a 2 s period the orphan sweep would remove those of any other
    # agent sharing this machine's kubepods hierarchy (other test sessions).
    recording = tmp_path / "recording.jsonl"
    flags = ("--address", "127.0.0.1", "--port", str(port), "--authorization-mode",
             "AlwaysAllow", "--anonymous-auth=true", "--cgroups-per-qos=false",
             "--record", str(recording))
    # A log directory left by a pod that no source knows and the runtime no longer holds.
    ghost = tmp_path / "pod-logs" / f"default_ghost-itest-node_{uuid.uuid4()}"
    (ghost / "main").mkdir(parents=True)
    (ghost / "main" / "0.log").write_text("left behind\n")
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        await wait_until(lambda: not ghost.exists(), 30, "the ghost pod's log directory to go")

        manifest = agent.write("crash.yaml", CRASH)
        pod = await agent.wait_for(
            "crash", lambda p: running(p, "main") and container(p, "main").restart_count == 3,
            timeout=120,
        )
        uid = pod.metadata.uid
        log_dir = tmp_path / "pod-logs" / f"default_crash-itest-node_{uid}" / "main"
        # Within a pass or two only the previous instance (exited) and the current one are
        # left, and only their log files (removed with the containers, not at the same instant).
        await wait_until(lambda: len(cri_containers(containerd, uid)) == 2
                         and sorted(p.name for p in log_dir.iterdir()) == ["2.log", "3.log"],
                         3 * GC_PERIOD + 30,
                         "the oldest dead instances and their log files to be removed")
        previous, current = cri_containers(containerd, uid)
        assert previous.state == api_pb2.CONTAINER_EXITED
        assert current.state == api_pb2.CONTAINER_RUNNING
        assert (previous.metadata.attempt, current.metadata.attempt) == (2, 3)
        assert agent.output(pod, "main", restart=2) == ["run 3"]
        # Running is reported when the process starts, maybe before its first line.
        await wait_until(lambda: agent.output(pod, "main", restart=3) == ["run 4"], 10,
                         "the current instance's line")
        async with httpx.AsyncClient(verify=False, timeout=10) as http:
            logs = f"https://127.0.0.1:{port}/containerLogs/default/crash-itest-node/main"
            assert (await http.get(f"{logs}?previous=true")).text == "run 3\n"
            assert (await http.get(logs)).text == "run 4\n"
        # The worker still sees the last exit.
        status = container(agent.pod("crash"), "main")
        assert status.last_state.terminated is not None
        assert status.last_state.terminated.exit_code == 1

        manifest.unlink()
        await agent.wait_gone("crash", timeout=60)
        await wait_until(
            lambda: not cri_containers(containerd, uid) and not cri_sandboxes(containerd, uid)
            and not log_dir.parent.exists(),
            3 * GC_PERIOD + 30,
            "the removed pod's containers, sandboxes and log directory to go",
        )

    # Each pass that removed something was recorded with its inputs; replay re-plans the
    # same removals: the ghost's log directory and the crash loop's instances 0 and 1 (the
    # removed pod's worker tore the rest down itself).
    result = replay(read_recording(recording).records)
    assert result.ok, result.divergence and result.divergence.diff
    passes = [entry.summary.split() for entry in result.trace if entry.pod == "(node)"]
    assert result.gc_passes == len(passes) >= 2, passes
    assert sum(int(words[3]) for words in passes) == 2, passes  # "container GC: remove N …"
    assert sum(int(words[7]) for words in passes) == 1, passes  # "… K pod log directories"

"""Static pods on a real containerd: run, restart policies, init/sidecars, edits, deletion."""

from __future__ import annotations

from datetime import datetime

import pytest
import trio
from cri_api.v1 import api_pb2

from tests.integration.harness import container, running, running_agent
from trio_kubelet.runtime import labels

pytestmark = pytest.mark.integration


def cri_containers(containerd, uid: str) -> list[api_pb2.Container]:
    request = api_pb2.ListContainersRequest(
        filter=api_pb2.ContainerFilter(label_selector={labels.POD_UID: uid})
    )
    return list(containerd.runtime_service.ListContainers(request, timeout=30).containers)


def cri_sandboxes(containerd, uid: str) -> list[api_pb2.PodSandbox]:
    request = api_pb2.ListPodSandboxRequest(
        filter=api_pb2.PodSandboxFilter(label_selector={labels.POD_UID: uid})
    )
    return list(containerd.runtime_service.ListPodSandbox(request, timeout=30).items)


def _ts(value: str | None) -> float:
    assert value, "timestamp missing"
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


POD = """\
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: {policy}
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "{script}"]
"""


async def test_static_pod_runs_on_containerd(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("web.yaml", POD.format(name="web", policy="Always", script="sleep 3600"))
        pod = await agent.wait_for(
            "web", lambda p: p.status.phase == "Running" and container(p, "main").ready
        )
        containers = cri_containers(containerd, pod.metadata.uid)
        assert [c.metadata.name for c in containers] == ["main"]
        assert containers[0].state == api_pb2.CONTAINER_RUNNING
        assert containers[0].labels[labels.POD_NAME] == "web-itest-node"
        sandboxes = cri_sandboxes(containerd, pod.metadata.uid)
        assert len(sandboxes) == 1 and sandboxes[0].state == api_pb2.SANDBOX_READY
        assert pod.status.pod_ip, "a CNI sandbox must get a pod IP"
        assert pod.metadata.annotations["kubernetes.io/config.source"] == "file"
        # The runtime wrote the container's log where the pod's log directory says.
        log_dir = agent.logs / f"default_web-itest-node_{pod.metadata.uid}" / "main"
        assert (log_dir / "0.log").exists()


@pytest.mark.parametrize(
    ("policy", "code", "restarts", "phase"),
    [
        ("Always", 0, True, None),
        ("Always", 1, True, None),
        ("OnFailure", 0, False, "Succeeded"),
        ("OnFailure", 1, True, None),
        ("Never", 0, False, "Succeeded"),
        ("Never", 1, False, "Failed"),
    ],
)
async def test_restart_policy_on_exit(containerd, tmp_path, policy, code, restarts, phase):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write(
            "job.yaml", POD.format(name="job", policy=policy, script=f"sleep 1; exit {code}")
        )
        if restarts:
            pod = await agent.wait_for("job", lambda p: container(p, "main").restart_count >= 1)
            last = container(pod, "main").last_state.terminated
            assert last is not None and last.exit_code == code
        else:
            pod = await agent.wait_for("job", lambda p: p.status.phase == phase)
            terminated = container(pod, "main").state.terminated
            assert terminated is not None and terminated.exit_code == code
            assert terminated.reason == ("Completed" if code == 0 else "Error")
            await trio.sleep(3)  # long enough for a wrongful restart to show
            assert container(agent.pod("job"), "main").restart_count == 0
            assert len(cri_containers(containerd, pod.metadata.uid)) == 1
            # A finished pod's sandbox is stopped, as the Go kubelet does (after the phase is
            # reported, so poll for it).
            with trio.fail_after(30):
                while not all(s.state == api_pb2.SANDBOX_NOTREADY
                              for s in cri_sandboxes(containerd, pod.metadata.uid)):
                    await trio.sleep(0.2)


async def test_crash_loop_backs_off(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("crash.yaml", POD.format(name="crash", policy="Always", script="exit 1"))
        pod = await agent.wait_for(
            "crash",
            lambda p: (
                (w := container(p, "main").state.waiting) is not None
                and w.reason == "CrashLoopBackOff"
            ),
            timeout=30,
        )
        waiting = container(pod, "main").state.waiting
        assert waiting is not None and "back-off 10s" in (waiting.message or "")
        pod = await agent.wait_for(
            "crash", lambda p: container(p, "main").restart_count >= 2, timeout=40
        )
        instances = sorted(cri_containers(containerd, pod.metadata.uid), key=lambda c: c.created_at)
        # The container GC's first pass (a second after the start) may have removed the first
        # instance already: it keeps only the newest dead one.
        assert len(instances) in (2, 3)
        # The first restart is immediate; the second waits out the initial 10 s backoff.
        gap = (instances[-1].created_at - instances[-2].created_at) / 1e9
        assert gap >= 9.5, f"second restart came after {gap:.1f}s, expected ≥ 10s backoff"


INIT_POD = """\
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: {policy}
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: first
    image: busybox:1.36
    command: ["sh", "-c", "echo first; sleep 1"]
  - name: second
    image: busybox:1.36
    command: ["sh", "-c", "echo second; exit {second_code}"]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sleep", "3600"]
"""


async def test_init_containers_run_in_order(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("init.yaml", INIT_POD.format(name="init", policy="Always", second_code=0))
        pod = await agent.wait_for("init", lambda p: running(p, "main"))
        first = container(pod, "first").state.terminated
        second = container(pod, "second").state.terminated
        assert first is not None and second is not None
        assert first.exit_code == second.exit_code == 0
        assert _ts(first.finished_at) <= _ts(second.started_at)
        main_started = container(pod, "main").state.running
        assert main_started is not None
        assert _ts(second.finished_at) <= _ts(main_started.started_at)
        assert pod.status.phase == "Running"


async def test_failing_init_container_blocks_and_fails_under_never(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("blocked.yaml", INIT_POD.format(name="blocked", policy="Always", second_code=3))
        agent.write("failed.yaml", INIT_POD.format(name="failed", policy="Never", second_code=3))
        failed = await agent.wait_for("failed", lambda p: p.status.phase == "Failed")
        assert container(failed, "second").state.terminated.exit_code == 3
        assert container(failed, "main").state.running is None
        blocked = await agent.wait_for(
            "blocked", lambda p: container(p, "second").restart_count >= 1
        )
        assert blocked.status.phase == "Pending"
        assert container(blocked, "main").state.running is None
        names = {c.metadata.name for c in cri_containers(containerd, blocked.metadata.uid)}
        assert "main" not in names


async def test_containers_behind_a_failing_init_container_wait_as_pod_initializing(
    containerd, tmp_path
):
    """As the NodeConformance spec "should not start app containers if init containers fail
    on a RestartAlways pod" watches it: in every status published until the failing init
    container has been restarted, the init container behind it and the app container wait
    with reason PodInitializing."""
    seen: list[tuple[str | None, str | None]] = []

    def restarted(pod) -> bool:
        statuses = {s.name: s for s in pod.status.init_container_statuses
                    + pod.status.container_statuses}
        if "init2" in statuses and "run1" in statuses:
            seen.append(tuple(
                statuses[n].state.waiting.reason if statuses[n].state.waiting else "not waiting"
                for n in ("init2", "run1")))
        return statuses["init1"].restart_count >= 1 if "init1" in statuses else False

    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("initfail.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: initfail}
            spec:
              terminationGracePeriodSeconds: 2
              initContainers:
              - {name: init1, image: "busybox:1.36", command: ["false"]}
              - {name: init2, image: "busybox:1.36", command: ["true"]}
              containers:
              - {name: run1, image: "busybox:1.36", command: ["sleep", "3600"]}
            """)
        pod = await agent.wait_for("initfail", restarted, timeout=60)
    assert seen and set(seen) == {("PodInitializing", "PodInitializing")}, seen
    assert container(pod, "init1").last_state.terminated.exit_code == 1
    assert pod.status.phase == "Pending"
    initialized = next(c for c in pod.status.conditions if c.type == "Initialized")
    assert initialized.message == "containers with incomplete status: [init1 init2]"


SIDECAR_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: sidecar}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  initContainers:
  - name: proxy
    image: busybox:1.36
    restartPolicy: Always
    command: ["sh", "-c", "trap 'sleep 1; exit 0' TERM; while true; do sleep 0.2; done"]
  containers:
  - name: main
    image: busybox:1.36
    command: ["sh", "-c", "sleep 2"]
"""


async def test_sidecar_starts_before_and_stops_after_main(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("sidecar.yaml", SIDECAR_POD)
        pod = await agent.wait_for("sidecar", lambda p: p.status.phase == "Succeeded")
        proxy = container(pod, "proxy").state.terminated
        main = container(pod, "main").state.terminated
        assert proxy is not None and main is not None, pod.status
        assert _ts(proxy.started_at) <= _ts(main.started_at)
        assert _ts(proxy.finished_at) >= _ts(main.finished_at)
        # The sidecar got SIGTERM (its trap exits 0), not SIGKILL.
        assert proxy.exit_code == 0


TWO_CONTAINERS = """\
apiVersion: v1
kind: Pod
metadata: {{name: edit}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: stable
    image: busybox:1.36
    command: ["sleep", "3600"]
  - name: changing
    image: busybox:1.36
    command: ["sleep", "{seconds}"]
"""


async def test_editing_a_manifest_restarts_only_the_changed_container(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("edit.yaml", TWO_CONTAINERS.format(seconds=3600))
        before = await agent.wait_for(
            "edit", lambda p: running(p, "stable") and running(p, "changing")
        )
        agent.write("edit.yaml", TWO_CONTAINERS.format(seconds=7200))
        after = await agent.wait_for(
            "edit",
            lambda p: (
                running(p, "changing")
                and container(p, "changing").container_id
                != container(before, "changing").container_id
            ),
            timeout=30,
        )
        assert after.metadata.uid == before.metadata.uid
        assert container(after, "stable").container_id == container(before, "stable").container_id
        assert container(after, "changing").restart_count == 1
        assert len(cri_sandboxes(containerd, after.metadata.uid)) == 1


async def test_deleting_a_manifest_removes_everything(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        path = agent.write(
            "gone.yaml", POD.format(name="gone", policy="Always", script="sleep 3600")
        )
        pod = await agent.wait_for("gone", lambda p: running(p, "main"))
        uid = pod.metadata.uid
        path.unlink()
        await agent.wait_gone("gone", timeout=30)
        assert cri_containers(containerd, uid) == []
        assert cri_sandboxes(containerd, uid) == []


async def test_malformed_manifest_changes_nothing_else(containerd, tmp_path, caplog):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("good.yaml", POD.format(name="good", policy="Always", script="sleep 3600"))
        good = await agent.wait_for("good", lambda p: running(p, "main"))
        agent.write("bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: bad\n")
        agent.write(
            "dup.yaml",
            """\
            apiVersion: v1
            kind: Pod
            metadata: {name: dup}
            spec:
              containers:
              - {name: app, image: busybox:1.36}
              - {name: app, image: busybox:1.36}
            """,
        )
        # Both files are read and refused (each with a log line); then nothing else changed.
        def both_refused() -> bool:
            messages = [r.getMessage() for r in caplog.records]
            return any("bad.yaml" in m for m in messages) and any(
                "dup.yaml" in m and "duplicate container name" in m for m in messages)

        with trio.fail_after(30):
            while not both_refused():
                await trio.sleep(0.2)
        assert agent.pod("bad") is None and agent.pod("dup") is None
        now = agent.pod("good")
        assert now is not None
        assert container(now, "main").container_id == container(good, "main").container_id

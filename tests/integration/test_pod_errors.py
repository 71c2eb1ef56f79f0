"""Runtime errors surface in pod status as kubectl shows them; kills honour the grace period."""

from __future__ import annotations

import pytest
import trio

from tests.integration.harness import container, running, running_agent
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import open_cri_client

pytestmark = pytest.mark.integration


def waiting_reason(pod, name: str) -> str | None:
    waiting = container(pod, name).state.waiting
    return waiting.reason if waiting is not None else None


async def test_missing_image_with_never_is_err_image_never_pull(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("never.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: never}
            spec:
              containers:
              - {name: app, image: "busybox:does-not-exist", imagePullPolicy: Never}
              - {name: ok, image: "busybox:1.36", command: ["sleep", "3600"]}
            """)
        pod = await agent.wait_for("never", lambda p: running(p, "ok")
                                   and waiting_reason(p, "app") == "ErrImageNeverPull")
        message = container(pod, "app").state.waiting.message
        assert message == ('Container image "busybox:does-not-exist" is not present with pull '
                           "policy of Never")
        assert pod.status.phase == "Pending"


async def test_unpullable_image_is_err_image_pull_then_backoff(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("pull.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: pull}
            spec:
              containers:
              - {name: app, image: "127.0.0.1:1/nothing/here:1.0"}
            """)
        pod = await agent.wait_for("pull", lambda p: waiting_reason(p, "app") == "ErrImagePull")
        assert "nothing/here" in container(pod, "app").state.waiting.message
        await agent.wait_for("pull", lambda p: waiting_reason(p, "app") == "ImagePullBackOff",
                             timeout=60)


async def test_missing_executable_fails_the_container_with_start_error(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("noexec.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: noexec}
            spec:
              restartPolicy: Never
              containers:
              - {name: app, image: "busybox:1.36", command: ["/no/such/binary"]}
            """)
        pod = await agent.wait_for("noexec", lambda p: p.status.phase == "Failed")
        # As with the Go kubelet on containerd: the start fails, the container is terminated
        # with StartError / 128 and the runtime's message, and Never makes the pod Failed.
        terminated = container(pod, "app").state.terminated
        assert terminated is not None
        assert (terminated.reason, terminated.exit_code) == ("StartError", 128)
        assert "/no/such/binary" in (terminated.message or "")
        await trio.sleep(2)
        assert container(agent.pod("noexec"), "app").restart_count == 0


async def test_host_network_pod_runs(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("hostnet.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: hostnet}
            spec:
              hostNetwork: true
              containers:
              - {name: app, image: "busybox:1.36", command: ["sleep", "3600"]}
            """)
        pod = await agent.wait_for("hostnet", lambda p: running(p, "app"))
        assert pod.status.phase == "Running"


async def test_container_ignoring_sigterm_is_killed_after_grace(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        path = agent.write("stubborn.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: stubborn}
            spec:
              terminationGracePeriodSeconds: 3
              containers:
              - name: app
                image: busybox:1.36
                command: ["sh", "-c", "trap '' TERM; while true; do sleep 0.2; done"]
            """)
        await agent.wait_for("stubborn", lambda p: running(p, "app"))
        started = trio.current_time()
        path.unlink()
        await agent.wait_gone("stubborn", timeout=30)
        took = trio.current_time() - started
        # SIGTERM is ignored, so the runtime sends SIGKILL once the 3 s grace is over.
        assert 2.5 <= took < 15, f"teardown took {took:.1f}s"


async def test_memory_limit_exceeded_is_oom_killed(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("oom.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: oom}
            spec:
              restartPolicy: Never
              containers:
              - name: hog
                image: busybox:1.36
                command: ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"]
                resources: {limits: {memory: 16Mi}}
            """)
        pod = await agent.wait_for("oom", lambda p: p.status.phase == "Failed")
        terminated = container(pod, "hog").state.terminated
        assert terminated is not None
        assert (terminated.reason, terminated.exit_code) == ("OOMKilled", 137)


async def test_pods_the_node_cannot_take_are_rejected_and_the_others_run(containerd, tmp_path):
    async with running_agent(
        containerd.endpoint, tmp_path, "--allowed-unsafe-sysctls", "kernel.msg*"
    ) as agent:
        agent.write("ok.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: ok}
            spec:
              securityContext:
                sysctls: [{name: kernel.msgmax, value: "65536"}]
              containers:
              - {name: app, image: "busybox:1.36", command: ["sleep", "3600"]}
            """)
        agent.write("sysctl.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: sysctl}
            spec:
              securityContext:
                sysctls: [{name: kernel.sem, value: "250 32000 100 128"}]
              containers:
              - {name: app, image: "busybox:1.36", command: ["sleep", "3600"]}
            """)
        agent.write("greedy.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: greedy}
            spec:
              containers:
              - name: app
                image: "busybox:1.36"
                command: ["sleep", "3600"]
                resources: {requests: {cpu: "512"}}
            """)
        sysctl = await agent.wait_for("sysctl", lambda p: p.status.phase == "Failed")
        assert (sysctl.status.reason, sysctl.status.message) == (
            "SysctlForbidden", 'Pod was rejected: forbidden sysctl: "kernel.sem" not allowlisted'
        )
        greedy = await agent.wait_for("greedy", lambda p: p.status.phase == "Failed")
        assert greedy.status.reason == "OutOfcpu"
        assert greedy.status.message.startswith(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 512000, used: 0,"
        )
        ok = await agent.wait_for("ok", lambda p: running(p, "app"))
        assert ok.status.phase == "Running"
        # What containerd holds: the rejected pods never got a sandbox.
        async with open_cri_client(containerd.endpoint) as client:
            held = {s.labels.get(labels.POD_UID) for s in await client.list_pod_sandbox()}
        assert ok.metadata.uid in held
        assert not {sysctl.metadata.uid, greedy.metadata.uid} & held

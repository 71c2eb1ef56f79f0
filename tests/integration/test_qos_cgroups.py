"""QoS cgroups (cgroupsPerQOS) on containerd: the kubepods hierarchy, pod limits, OOM kills.

On whichever hierarchy the machine boots (`cgroup_files.MODE`): each mode's own files
and the values the Go kubelet writes there.
"""

from __future__ import annotations

import pytest
import trio

from tests.integration.cgroup_files import V2, directory, go_cpu_weight, has_controllers, read
from tests.integration.harness import container, running, running_agent

pytestmark = pytest.mark.integration

if not has_controllers("cpu", "memory"):
    pytest.skip("the cgroup cpu and memory controllers are needed", allow_module_level=True)


async def test_pods_get_cgroups_in_their_qos_tier_and_lose_them_when_gone(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("qos.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: guaranteed}
            spec:
              terminationGracePeriodSeconds: 2
              containers:
              - name: app
                image: busybox:1.36
                command: ["sleep", "3600"]
                resources: {limits: {cpu: 500m, memory: 64Mi}}
            ---
            apiVersion: v1
            kind: Pod
            metadata: {name: burstable}
            spec:
              terminationGracePeriodSeconds: 2
              containers:
              - name: app
                image: busybox:1.36
                command: ["sleep", "3600"]
                resources: {requests: {cpu: 250m}}
            ---
            apiVersion: v1
            kind: Pod
            metadata: {name: besteffort}
            spec:
              terminationGracePeriodSeconds: 2
              containers:
              - {name: app, image: busybox:1.36, command: ["sleep", "3600"]}
            """)
        pods = {}
        for name in ("guaranteed", "burstable", "besteffort"):
            pods[name] = await agent.wait_for(name, lambda p: running(p, "app"))
        guaranteed = ("kubepods", f"pod{pods['guaranteed'].metadata.uid}")
        burstable = ("kubepods", "burstable", f"pod{pods['burstable'].metadata.uid}")
        besteffort = ("kubepods", "besteffort", f"pod{pods['besteffort'].metadata.uid}")
        if V2:
            assert read("cpu", *guaranteed, "cpu.weight") == str(go_cpu_weight(512))
            assert read("cpu", *guaranteed, "cpu.max") == "50000 100000"
            assert read("memory", *guaranteed, "memory.max") == str(64 * 2**20)
            assert read("cpu", *burstable, "cpu.weight") == str(go_cpu_weight(256))
            assert read("cpu", *burstable, "cpu.max") == "max 100000", "no limit"
            assert read("memory", *burstable, "memory.max") == "max"
            assert read("cpu", *besteffort, "cpu.weight") == str(go_cpu_weight(2))
            tier_weight = int(read("cpu", "kubepods", "burstable", "cpu.weight"))
            assert tier_weight >= go_cpu_weight(256)
        else:
            assert read("cpu", *guaranteed, "cpu.shares") == "512"
            assert read("cpu", *guaranteed, "cpu.cfs_quota_us") == "50000"
            assert read("memory", *guaranteed, "memory.limit_in_bytes") == str(64 * 2**20)
            assert read("cpu", *burstable, "cpu.shares") == "256"
            assert read("cpu", *besteffort, "cpu.shares") == "2"
            # The tier holds the requests of its pods.
            assert int(read("cpu", "kubepods", "burstable", "cpu.shares")) >= 256
        # The containers live inside their pod.
        container_id = container(pods["burstable"], "app").container_id.partition("://")[2]
        assert directory("memory", *burstable, container_id).is_dir()

        (agent.manifests / "qos.yaml").unlink()
        for name in ("guaranteed", "burstable", "besteffort"):
            await agent.wait_gone(name)
        for parts in (guaranteed, burstable, besteffort):
            assert not directory("memory", *parts).exists()
            assert not directory("cpu", *parts).exists()


async def test_container_over_its_memory_limit_is_oom_killed(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        # The shell itself holds 64 MiB in a variable, under a 16 MiB limit.
        agent.write("hog.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: hog}
            spec:
              restartPolicy: Never
              containers:
              - name: app
                image: busybox:1.36
                command: ["sh", "-c", "a=$(head -c 67108864 /dev/zero | tr '\\\\0' x); echo $${#a}"]
                resources: {limits: {memory: 16Mi}}
            """)
        pod = await agent.wait_for("hog", lambda p: p.status.phase == "Failed")
        terminated = container(pod, "app").state.terminated
        assert terminated is not None
        assert (terminated.reason, terminated.exit_code) == ("OOMKilled", 137), terminated


async def test_pod_max_pids_caps_the_processes_of_a_pod(containerd, tmp_path):
    """--pod-max-pids (podPidsLimit) is each pod cgroup's pids.max: a pod cannot fork past it."""
    if not has_controllers("pids"):
        pytest.skip("the cgroup pids controller is needed")
    async with running_agent(containerd.endpoint, tmp_path, "--pod-max-pids", "12") as agent:
        # A subshell forks 30 sleeps (and gives up at the first refused fork); the main
        # shell then reports and stays.
        agent.write("forks.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: forks}
            spec:
              terminationGracePeriodSeconds: 1
              containers:
              - name: app
                image: busybox:1.36
                command:
                - sh
                - -c
                - (for i in $(seq 30); do sleep 3600 & done) 2>&1; echo forked; exec sleep 3600
            """)
        pod = await agent.wait_for("forks", lambda p: running(p, "app"))
        cgroup = ("kubepods", "besteffort", f"pod{pod.metadata.uid}")
        assert read("pids", *cgroup, "pids.max") == "12"
        with trio.move_on_after(30):
            while "forked" not in agent.output(pod, "app"):
                await trio.sleep(0.2)
        output = agent.output(pod, "app")
        assert "forked" in output and any("can't fork" in line for line in output), output
        assert int(read("pids", *cgroup, "pids.current")) <= 12

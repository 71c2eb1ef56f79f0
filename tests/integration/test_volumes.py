"""Volumes on containerd: emptyDir (disk and memory), hostPath, downwardAPI, subPath; bad input
that keeps a pod waiting instead of crashing it; teardown."""

from __future__ import annotations

import pytest

from tests.integration.harness import container, running, running_agent

pytestmark = pytest.mark.integration


async def test_empty_dir_host_path_downward_api_and_sub_path(containerd, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "from-host.txt").write_text("host data\n")
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("vols.yaml", f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: vols, labels: {{app: demo}}}}
            spec:
              restartPolicy: Never
              initContainers:
              - name: writer
                image: busybox:1.36
                command: ["sh", "-c", "echo hello > /scratch/greeting; mkdir -p /scratch/sub"]
                volumeMounts: [{{name: scratch, mountPath: /scratch}}]
              containers:
              - name: reader
                image: busybox:1.36
                command: ["sh", "-c"]
                args:
                - >-
                  cat /scratch/greeting; cat /host/from-host.txt; cat /info/labels; echo;
                  grep -c ' /ram tmpfs ' /proc/mounts; touch /sub/made-here; ls /scratch/sub;
                  if touch /info/x 2>/dev/null; then echo rw; else echo ro; fi
                volumeMounts:
                - {{name: scratch, mountPath: /scratch}}
                - {{name: scratch, mountPath: /sub, subPath: sub}}
                - {{name: host, mountPath: /host}}
                - {{name: info, mountPath: /info}}
                - {{name: ram, mountPath: /ram}}
              volumes:
              - {{name: scratch, emptyDir: {{}}}}
              - {{name: ram, emptyDir: {{medium: Memory, sizeLimit: 8Mi}}}}
              - {{name: host, hostPath: {{path: {shared}, type: Directory}}}}
              - name: info
                downwardAPI:
                  items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]
            """)
        pod = await agent.wait_for("vols", lambda p: p.status.phase in ("Succeeded", "Failed"))
        assert pod.status.phase == "Succeeded", container(pod, "reader").state
        assert agent.output(pod, "reader") == [
            "hello", "host data", 'app="demo"', "1", "made-here", "ro",
        ]
        uid = pod.metadata.uid
        pod_dir = tmp_path / "root" / "pods" / uid
        assert (pod_dir / "volumes" / "kubernetes.io~empty-dir" / "scratch" / "greeting").exists()
        (agent.manifests / "vols.yaml").unlink()
        await agent.wait_gone("vols")
        assert not pod_dir.exists()
        assert (shared / "from-host.txt").exists()  # a hostPath is never removed


async def test_bad_volumes_keep_the_pod_waiting_and_others_running(containerd, tmp_path):
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("bad.yaml", f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: wrongtype}}
            spec:
              containers:
              - name: app
                image: busybox:1.36
                command: ["sleep", "3600"]
                volumeMounts: [{{name: host, mountPath: /host}}]
              volumes:
              - {{name: host, hostPath: {{path: {not_a_dir}, type: Directory}}}}
            ---
            apiVersion: v1
            kind: Pod
            metadata: {{name: escape}}
            spec:
              containers:
              - name: app
                image: busybox:1.36
                command: ["sleep", "3600"]
                volumeMounts: [{{name: scratch, mountPath: /x, subPath: ../../etc}}]
              volumes:
              - {{name: scratch, emptyDir: {{}}}}
            ---
            apiVersion: v1
            kind: Pod
            metadata: {{name: fine}}
            spec:
              containers:
              - {{name: app, image: busybox:1.36, command: ["sleep", "3600"]}}
            """)
        await agent.wait_for("fine", lambda p: running(p, "app"))

        def waiting(pod, reason):
            state = container(pod, "app").state.waiting
            return state is not None and state.reason == reason

        wrong = await agent.wait_for("wrongtype", lambda p: waiting(p, "ContainerCreating"))
        assert wrong.status.phase == "Pending"
        escape = await agent.wait_for("escape",
                                      lambda p: waiting(p, "CreateContainerConfigError"))
        assert ".." in container(escape, "app").state.waiting.message

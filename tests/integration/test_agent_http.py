"""The running agent serves the kubelet API: healthz, pods, metrics, logs, stats, auth."""

from __future__ import annotations

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import running, running_agent
from tests.net import free_port

pytestmark = pytest.mark.integration

POD = """\
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: busybox:1.36
    command: ["sh", "-c", "echo hello from app; sleep 3600"]
"""


async def test_agent_serves_the_kubelet_api(containerd, tmp_path):
    port, healthz, read_only = free_port(), free_port(), free_port()
    flags = ("--address", "127.0.0.1", "--port", str(port), "--healthz-port", str(healthz),
             "--read-only-port", str(read_only), "--authorization-mode", "AlwaysAllow",
             "--anonymous-auth=true")
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        agent.write("web.yaml", POD)
        await agent.wait_for("web", lambda p: running(p, "app"))
        async with httpx.AsyncClient(verify=False, timeout=10) as http:
            health = await http.get(f"http://127.0.0.1:{healthz}/healthz")
            assert (health.status_code, health.text) == (200, "ok")

            pods = (await http.get(f"https://127.0.0.1:{port}/pods")).json()
            assert pods["kind"] == "PodList"
            [item] = pods["items"]
            assert item["metadata"]["name"] == "web-itest-node"
            assert item["status"]["phase"] == "Running"

            metrics = (await http.get(f"http://127.0.0.1:{read_only}/metrics")).text
            families = {f.name: f for f in text_string_to_metric_families(metrics)}
            assert "kubelet_runtime_operations" in families
            # Running comes before the line reaches the log file: poll until it does.
            with trio.fail_after(10):
                while (logs := await http.get(
                        f"https://127.0.0.1:{port}/containerLogs/default/web-itest-node/app"
                )).text != "hello from app\n":
                    await trio.sleep(0.2)
            assert logs.status_code == 200
            # Logs are not served on the read-only port.
            hidden = await http.get(
                f"http://127.0.0.1:{read_only}/containerLogs/default/web-itest-node/app")
            assert hidden.status_code == 404

            with trio.fail_after(30):  # a cgroup sample with the pod comes within an interval
                while True:
                    summary = await http.get(f"https://127.0.0.1:{port}/stats/summary")
                    pods_seen = (summary.json()["pods"] if summary.status_code == 200 else [])
                    if any(p["podRef"]["name"] == "web-itest-node" for p in pods_seen):
                        break
                    await trio.sleep(1)
            [stats] = [p for p in pods_seen if p["podRef"]["name"] == "web-itest-node"]
            assert stats["containers"][0]["name"] == "app"
            assert stats["containers"][0]["memory"]["workingSetBytes"] > 0


async def test_anonymous_requests_are_refused_by_default(containerd, tmp_path):
    port = free_port()
    flags = ("--address", "127.0.0.1", "--port", str(port), "--healthz-port", "0")
    async with (
        running_agent(containerd.endpoint, tmp_path, *flags),
        httpx.AsyncClient(verify=False, timeout=10) as http,
    ):
        response = await http.get(f"https://127.0.0.1:{port}/pods")
        assert response.status_code == 401


async def test_summary_reports_pod_volumes_and_counts_an_empty_dir_as_ephemeral_storage(
    containerd, tmp_path, monkeypatch
):
    from trio_kubelet import agent as agent_module

    monkeypatch.setattr(agent_module, "HOUSEKEEPING_INTERVAL", 1.0)
    port = free_port()
    flags = ("--address", "127.0.0.1", "--port", str(port), "--authorization-mode",
             "AlwaysAllow", "--anonymous-auth=true", "--volume-stats-agg-period", "1s")
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        agent.write("scratch.yaml", """\
apiVersion: v1
kind: Pod
metadata: {name: scratch}
spec:
  terminationGracePeriodSeconds: 1
  volumes: [{name: scratch, emptyDir: {}}]
  containers:
  - name: app
    image: busybox:1.36
    volumeMounts: [{name: scratch, mountPath: /scratch}]
    command: ["sh", "-c", "dd if=/dev/urandom of=/scratch/data bs=1024 count=3072; sleep 3600"]
""")
        await agent.wait_for("scratch", lambda p: running(p, "app"))
        volume: dict = {}
        async with httpx.AsyncClient(verify=False, timeout=10) as http:
            with trio.fail_after(30):
                while volume.get("usedBytes", 0) < 3 << 20:
                    await trio.sleep(0.5)
                    summary = (await http.get(f"https://127.0.0.1:{port}/stats/summary")).json()
                    pods = [p for p in summary["pods"]
                            if p["podRef"]["name"] == "scratch-itest-node"]
                    volumes = pods[0].get("volume", []) if pods else []
                    volume = next((v for v in volumes if v["name"] == "scratch"), {})
        assert volume["capacityBytes"] > volume["availableBytes"] > 0
        assert volume["inodesUsed"] >= 2  # the directory and the file
        assert pods[0]["ephemeral-storage"]["usedBytes"] >= 3 << 20

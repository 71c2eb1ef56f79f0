"""`promtool check metrics` on the agent's four Prometheus endpoints, with a probed pod running.

promtool (Debian's prometheus package; scripts/bootstrap installs the binary) parses each answer
and lints it as Prometheus' own client libraries would be: HELP and TYPE for every family, base
units, counters ending in ``_total``, no reserved suffixes or camelCase.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import httpx
import pytest
import trio

from tests.integration.harness import container, running_agent
from tests.net import free_port

pytestmark = pytest.mark.integration

ENDPOINTS = ("/metrics", "/metrics/cadvisor", "/metrics/resource", "/metrics/probes")

# Counters the Go kubelet itself exposes without the `_total` promtool asks for; renaming them
# would break the dashboards and alerts written against the Go names, so they keep them.
GO_COUNTERS_WITHOUT_TOTAL = {
    "kubelet_evictions",  # pkg/kubelet/metrics (since 1.16), KubeNodeEviction alerts on it
    "container_memory_failcnt",  # cAdvisor's, served by /metrics/cadvisor (cgroup v1 only)
}

HTTPD = "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www"
POD = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: probed}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: busybox:1.36
    command: ["sh", "-c", "{HTTPD}"]
    readinessProbe:
      httpGet: {{path: /, port: 8080}}
      periodSeconds: 1
    livenessProbe:
      exec: {{command: ["true"]}}
      periodSeconds: 1
"""


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool is not installed (scripts/bootstrap installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def lint(promtool: str, text: str) -> list[str]:
    """promtool's findings on ``text`` (one per line); a text it cannot parse fails the test."""
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    findings = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode in (0, 3), f"promtool failed ({done.returncode}): {findings}"
    return findings


def unexpected(findings: list[str]) -> list[str]:
    """The findings that are not a Go kubelet name promtool dislikes."""
    allowed = {f'{name} counter metrics should have "_total" suffix'
               for name in GO_COUNTERS_WITHOUT_TOTAL}
    return [finding for finding in findings if finding not in allowed]


async def test_promtool_finds_nothing_wrong_with_the_four_endpoints(containerd, tmp_path, promtool):
    port = free_port()
    flags = ("--address", "127.0.0.1", "--port", str(port), "--authorization-mode", "AlwaysAllow",
             "--anonymous-auth=true")
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        agent.write("probed.yaml", POD)
        await agent.wait_for("probed", lambda p: container(p, "web").ready, timeout=60)
        answers: dict[str, str] = {}
        async with httpx.AsyncClient(base_url=f"https://127.0.0.1:{port}", verify=False,
                                     timeout=10) as http:
            with trio.fail_after(40):  # every endpoint shows the pod within a sample or two
                while len(answers) < len(ENDPOINTS):
                    for path in ENDPOINTS:
                        response = await http.get(path)
                        assert response.status_code == 200, (path, response.text)
                        if path == "/metrics" or 'pod="probed-itest-node"' in response.text:
                            answers[path] = response.text
                    await trio.sleep(1)

    # The exposition has what a scraper needs from each: the pod's figures and the agent's own.
    assert 'prober_probe_total{probe_type="Readiness",result="successful"' in answers[
        "/metrics/probes"]
    assert "pod_memory_working_set_bytes{" in answers["/metrics/resource"]
    assert 'container_memory_working_set_bytes{container="web"' in answers["/metrics/cadvisor"]
    assert "kubelet_running_pods 1" in answers["/metrics"]
    findings = {path: lint(promtool, text) for path, text in answers.items()}
    print(findings)
    assert {path: unexpected(found) for path, found in findings.items()} == {
        path: [] for path in ENDPOINTS}

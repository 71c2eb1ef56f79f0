"""Liveness, readiness and startup probes of every kind, on containerd (node conformance style)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator

import pytest
import trio
from grpclib.health.service import Health
from grpclib.server import Server

from tests.integration.harness import container, running, running_agent
from tests.net import free_port

pytestmark = pytest.mark.integration

# A web server inside the pod: busybox httpd serving /www on port 8080 ("http").
HTTPD = 'mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www'


def ready(pod, name: str) -> bool:
    try:
        return container(pod, name).ready
    except AssertionError:
        return False


def condition(pod, kind: str) -> str | None:
    return next((c.status for c in pod.status.conditions if c.type == kind), None)


async def test_failing_liveness_probe_restarts_the_container(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("live.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: live}
            spec:
              containers:
              - name: app
                image: busybox:1.36
                command: ["sh", "-c", "touch /tmp/healthy; sleep 2; rm /tmp/healthy; sleep 3600"]
                livenessProbe:
                  exec: {command: ["cat", "/tmp/healthy"]}
                  periodSeconds: 1
                  failureThreshold: 2
                  # sh as PID 1 ignores SIGTERM: the probe's own grace (not the pod's 30 s)
                  # decides when SIGKILL comes.
                  terminationGracePeriodSeconds: 2
            """)
        await agent.wait_for("live", lambda p: running(p, "app"))
        pod = await agent.wait_for("live", lambda p: container(p, "app").restart_count >= 1,
                                   timeout=30)
        last = container(pod, "app").last_state.terminated
        assert last is not None and last.exit_code == 137, last  # SIGKILL after SIGTERM
        assert pod.status.phase == "Running"


async def test_failing_readiness_probe_keeps_the_container_unready(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("ready.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: ready}
            spec:
              containers:
              - name: good
                image: busybox:1.36
                command: ["sleep", "3600"]
                readinessProbe:
                  exec: {command: ["true"]}
                  periodSeconds: 1
              - name: bad
                image: busybox:1.36
                command: ["sleep", "3600"]
                readinessProbe:
                  exec: {command: ["false"]}
                  periodSeconds: 1
            """)
        pod = await agent.wait_for("ready", lambda p: ready(p, "good"), timeout=30)
        await trio.sleep(3)  # several failed readiness probes later
        pod = agent.pod("ready")
        assert running(pod, "bad") and not ready(pod, "bad")
        assert container(pod, "bad").restart_count == 0  # readiness never restarts
        assert condition(pod, "ContainersReady") == "False"
        assert condition(pod, "Ready") == "False"
        assert ready(pod, "good")


async def test_startup_probe_holds_liveness_off_until_it_succeeds(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        # Liveness alone would kill this container within 2 s; the startup probe keeps
        # liveness off until /tmp/started exists, 4 s in.
        agent.write("slow.yaml", """\
            apiVersion: v1
            kind: Pod
            metadata: {name: slow}
            spec:
              containers:
              - name: app
                image: busybox:1.36
                command: ["sh", "-c", "sleep 4; touch /tmp/started; sleep 3600"]
                startupProbe:
                  exec: {command: ["cat", "/tmp/started"]}
                  periodSeconds: 1
                  failureThreshold: 30
                livenessProbe:
                  exec: {command: ["cat", "/tmp/started"]}
                  periodSeconds: 1
                  failureThreshold: 1
            """)
        pod = await agent.wait_for("slow", lambda p: running(p, "app"))
        assert container(pod, "app").started is False
        pod = await agent.wait_for("slow", lambda p: container(p, "app").started is True,
                                   timeout=30)
        await trio.sleep(2)  # liveness now runs, and passes
        pod = agent.pod("slow")
        assert container(pod, "app").restart_count == 0
        assert ready(pod, "app")


async def test_http_and_tcp_probes(containerd, tmp_path):
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("web.yaml", f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: web}}
            spec:
              containers:
              - name: web
                image: busybox:1.36
                command: ["sh", "-c", "{HTTPD}"]
                ports: [{{name: http, containerPort: 8080}}]
                readinessProbe:
                  httpGet: {{path: /index.html, port: http}}
                  periodSeconds: 1
                livenessProbe:
                  tcpSocket: {{port: 8080}}
                  periodSeconds: 1
              - name: missing-page
                image: busybox:1.36
                command: ["sleep", "3600"]
                readinessProbe:
                  httpGet: {{path: /nothing-here, port: 8080}}
                  periodSeconds: 1
              - name: closed-port
                image: busybox:1.36
                command: ["sleep", "3600"]
                readinessProbe:
                  tcpSocket: {{port: 9999}}
                  periodSeconds: 1
            """)
        pod = await agent.wait_for("web", lambda p: ready(p, "web"), timeout=30)
        await trio.sleep(3)
        pod = agent.pod("web")
        assert ready(pod, "web") and container(pod, "web").restart_count == 0
        assert running(pod, "missing-page") and not ready(pod, "missing-page")  # a 404
        assert running(pod, "closed-port") and not ready(pod, "closed-port")


# Answers every request with what agnhost's /redirect?loc=http://0.0.0.0/ answers (the
# NodeConformance spec's probe target): a 302 to another host. nc runs the script per
# connection; it reads the request's head before answering.
REDIRECT_BODY = '<a href="http://0.0.0.0/">Found</a>.'
REDIRECT_SCRIPT = (
    "while read -r l; do [ ${#l} -le 1 ] && break; done; "
    'printf "HTTP/1.1 302 Found\\r\\nLocation: http://0.0.0.0/\\r\\n'
    f'Content-Length: {len(REDIRECT_BODY)}\\r\\nConnection: close\\r\\n\\r\\n%s" '
    f"'{REDIRECT_BODY}'"
)
REDIRECTOR = ["nc", "-ll", "-p", "8080", "-e", "sh", "-c", REDIRECT_SCRIPT]


async def test_http_probe_redirected_to_another_host_succeeds_with_a_warning(
    containerd, tmp_path, caplog
):
    """Go's prober stops at a redirect to another host: the liveness probe succeeds (no
    restart, though one failure would kill) and each probe is a ProbeWarning event."""
    caplog.set_level(logging.DEBUG, logger="trio_kubelet.kube_events")
    manifest = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "redirected"},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [{
            "name": "web", "image": "busybox:1.36", "command": REDIRECTOR,
            # The initial delay gives nc time to bind: a probe before it listens would fail
            # (and kill) for a reason that is not the redirect.
            "livenessProbe": {"httpGet": {"path": "/redirect", "port": 8080},
                              "initialDelaySeconds": 2, "periodSeconds": 1,
                              "failureThreshold": 1},
        }]},
    }
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        agent.write("redirected.yaml", json.dumps(manifest))
        await agent.wait_for("redirected", lambda p: running(p, "web"), timeout=30)
        with trio.fail_after(20):
            while not (warnings := [
                r.getMessage() for r in caplog.records
                if r.name == "trio_kubelet.kube_events" and "ProbeWarning" in r.getMessage()
            ]):
                await trio.sleep(0.2)
        await trio.sleep(3)  # a few more probes, each of which would kill on a failure
        pod = agent.pod("redirected")
    assert pod is not None and container(pod, "web").restart_count == 0
    assert warnings[0].endswith(
        f"ProbeWarning: Liveness probe warning: Probe terminated redirects, "
        f"Response body: {REDIRECT_BODY}"), warnings


@pytest.fixture
def grpc_health_server() -> Iterator[tuple[int, Health]]:
    """A standard gRPC health service on 127.0.0.1, in an asyncio loop of its own thread."""
    port = free_port()
    health = Health()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def serve() -> Server:
        server = Server([health])
        await server.start("127.0.0.1", port)
        started.set()
        return server

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    started.wait(10)
    yield port, health
    server.close()
    asyncio.run_coroutine_threadsafe(server.wait_closed(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


async def test_grpc_probe(containerd, tmp_path, grpc_health_server):
    port, _ = grpc_health_server
    async with running_agent(containerd.endpoint, tmp_path) as agent:
        # A host-network pod: its IP is the node's (127.0.0.1), where the health server runs.
        agent.write("grpc.yaml", f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: grpc}}
            spec:
              hostNetwork: true
              containers:
              - name: serving
                image: busybox:1.36
                command: ["sleep", "3600"]
                readinessProbe:
                  grpc: {{port: {port}}}
                  periodSeconds: 1
              - name: unknown-service
                image: busybox:1.36
                command: ["sleep", "3600"]
                readinessProbe:
                  grpc: {{port: {port}, service: no.such.Service}}
                  periodSeconds: 1
            """)
        pod = await agent.wait_for("grpc", lambda p: ready(p, "serving"), timeout=30)
        await trio.sleep(3)
        pod = agent.pod("grpc")
        assert ready(pod, "serving")
        assert running(pod, "unknown-service") and not ready(pod, "unknown-service")

"""Logs, exec, attach and port-forward through our blueprints, against a real containerd.

The agent runs in-process; the two blueprints are served on 127.0.0.1 by the kubelet's own
server (``serve_app``, plain HTTP, no auth) in a small Quart-Trio app of the test's own.
"""

from __future__ import annotations

import base64
import json
import struct
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio
import trio_websocket
from cri_api.v1 import api_pb2
from quart_trio import QuartTrio

from tests.integration.harness import NODE, RunningAgent, container, running, running_agent
from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.server.routes_logs import logs_blueprint
from trio_kubelet.server.routes_streaming import streaming_blueprint
from trio_kubelet.server.serve import serve_app
from trio_kubelet.server.view import NodeView

pytestmark = pytest.mark.integration

LONG_LINE = 40_000  # containerd splits lines at 16 KiB: this one arrives as P, P, F chunks

TALK = f"""\
apiVersion: v1
kind: Pod
metadata: {{name: talk}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command:
    - sh
    - -c
    - |
      echo alpha; echo beta; echo gamma >&2
      head -c {LONG_LINE} /dev/zero | tr '\\0' x; echo
      rm -f /tmp/stop
      while [ ! -e /tmp/stop ]; do sleep 0.1; done
      echo bye
  - name: server
    image: busybox:1.36
    command: ["nc", "-ll", "-p", "8080", "-e", "echo", "hi"]
"""
FIRST_OUTPUT = b"alpha\nbeta\ngamma\n" + b"x" * LONG_LINE + b"\n"
POD = f"talk-{NODE}"


@dataclass
class Served:
    agent: RunningAgent
    port: int
    containerd: object

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def exec_in(self, container_name: str, *command: str) -> None:
        """Run a command in a container through CRI directly (not through our endpoints)."""
        pod = self.agent.pod("talk")
        assert pod is not None
        container_id = container(pod, container_name).container_id.partition("://")[2]
        request = api_pb2.ExecSyncRequest(container_id=container_id, cmd=list(command), timeout=10)
        await trio.to_thread.run_sync(
            lambda: self.containerd.runtime_service.ExecSync(request, timeout=30))


@asynccontextmanager
async def serving(containerd, tmp_path: Path,
                  config: KubeletConfiguration | None = None) -> AsyncIterator[Served]:
    """The agent running the TALK pod, and our blueprints served on an ephemeral port."""
    node_logs = tmp_path / "node-logs"
    node_logs.mkdir()
    (node_logs / "kubelet.log").write_text("started\n")
    (tmp_path / "secret").write_text("do not serve\n")
    async with running_agent(containerd.endpoint, tmp_path) as agent, \
            open_cri_client(containerd.endpoint) as client, trio.open_nursery() as nursery:
        view = NodeView(options=AgentOptions(config=config or KubeletConfiguration(),
                                             node_name=NODE),
                        store=agent.store, client=client, last_relist=lambda: None,
                        last_sync_loop=lambda: None, pod_logs_dir=agent.logs,
                        node_logs_dir=node_logs)
        app = QuartTrio("streaming-itest")
        app.register_blueprint(logs_blueprint(view))
        app.register_blueprint(streaming_blueprint(view))
        _, port = await nursery.start(serve_app, app, "127.0.0.1", 0)
        agent.write("talk.yaml", TALK)
        await agent.wait_for("talk", lambda p: running(p, "main") and running(p, "server"))
        yield Served(agent, port, containerd)
        nursery.cancel_scope.cancel()


async def get(served: Served, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.base, timeout=30) as http:
        return await http.get(path)


async def wait_for_log(served: Served, path: str, expected: bytes) -> bytes:
    body = b""
    with trio.move_on_after(15):
        while (body := (await get(served, path)).content) != expected:
            await trio.sleep(0.2)
    return body


async def test_logs_follow_and_previous(containerd, tmp_path):
    with trio.fail_after(120):
        async with serving(containerd, tmp_path) as served:
            logs = f"/containerLogs/default/{POD}/main"
            # Exactly what the container printed, the 40 000-character line joined again.
            stdout = await wait_for_log(served, f"{logs}?stream=Stdout",
                                        FIRST_OUTPUT.replace(b"gamma\n", b""))
            assert stdout == FIRST_OUTPUT.replace(b"gamma\n", b"")
            # stdout and stderr are separate pipes: stderr's line may land in the file later.
            stderr = await wait_for_log(served, f"{logs}?stream=Stderr", b"gamma\n")
            assert stderr == b"gamma\n"
            both = (await get(served, logs)).content
            assert sorted(both.splitlines()) == sorted(FIRST_OUTPUT.splitlines())
            tail = await get(served, f"{logs}?tailLines=1&stream=Stdout")
            assert tail.content == b"x" * LONG_LINE + b"\n"
            assert (await get(served, f"{logs}?limitBytes=3&stream=Stdout")).content == b"alp"
            stamped = (await get(served, f"{logs}?timestamps=true&tailLines=2&stream=Stdout"))
            stamp, _, text = stamped.content.partition(b" ")
            assert text.startswith(b"beta\n") and len(stamp) == 30
            previous = await get(served, f"{logs}?previous=true")
            assert previous.status_code == 400
            assert previous.text == f'previous terminated container "main" in pod "{POD}" not found'

            # follow: new lines stream in, and the stream ends when the container stops.
            received = bytearray()
            async with httpx.AsyncClient(base_url=served.base, timeout=30) as http, \
                    http.stream("GET", f"{logs}?follow=true&tailLines=0") as response:
                assert response.status_code == 200
                chunks = response.aiter_bytes()
                await served.exec_in("main", "sh", "-c", "echo followed > /proc/1/fd/1")
                with trio.fail_after(10):
                    while b"followed\n" not in received:
                        received += await chunks.__anext__()
                await served.exec_in("main", "touch", "/tmp/stop")
                with trio.fail_after(15):  # ends by itself: no switch to the next instance
                    async for chunk in chunks:
                        received += chunk
            assert bytes(received) == b"followed\nbye\n"

            # After the restart, previous is the first instance, whole.
            await served.agent.wait_for(
                "talk", lambda p: container(p, "main").restart_count >= 1 and running(p, "main"))
            previous = await get(served, f"{logs}?previous=true&stream=Stdout")
            assert previous.status_code == 200
            assert previous.content == (FIRST_OUTPUT.replace(b"gamma\n", b"")
                                        + b"followed\nbye\n")
            current = await wait_for_log(served, f"{logs}?stream=Stdout",
                                         FIRST_OUTPUT.replace(b"gamma\n", b""))
            assert current == FIRST_OUTPUT.replace(b"gamma\n", b"")


async def test_log_errors_and_node_logs(containerd, tmp_path):
    with trio.fail_after(90):
        async with serving(containerd, tmp_path) as served:
            missing = await get(served, "/containerLogs/default/nope/main")
            assert (missing.status_code, missing.text) == (
                404, 'pod "nope" in namespace "default" not found')
            assert (await get(served, f"/containerLogs/default/{POD}/nope")).status_code == 404
            bad = await get(served, f"/containerLogs/default/{POD}/main?tailLines=-2")
            assert bad.status_code == 400 and "tailLines" in bad.text

            listing = await get(served, "/logs/")
            assert listing.status_code == 200 and 'href="kubelet.log"' in listing.text
            assert (await get(served, "/logs/kubelet.log")).text == "started\n"
            # Traversal attempts, sent raw so no client normalises them first.
            for target in ("/logs/../secret", "/logs/%2e%2e/secret", "/logs/%2E%2E%2Fsecret",
                           "/logs/..%2fsecret", "/logs//etc/passwd", "/logs/%2Fetc%2Fpasswd"):
                status, body = await raw_get(served.port, target)
                assert status in (400, 404, 308), (target, status)
                assert b"do not serve" not in body and b"root:" not in body, target


async def raw_get(port: int, target: str) -> tuple[int, bytes]:
    """GET ``target`` exactly as written (no client-side normalisation of dots or escapes)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some()
            head, _, body = data.partition(b"\r\n\r\n")
            lengths = [line.split(b":", 1)[1] for line in head.lower().split(b"\r\n")
                       if line.startswith(b"content-length:")]
            while lengths and len(body) < int(lengths[0]):
                body += await stream.receive_some()
    return int(head.split(b" ", 2)[1]), body


async def channels(served: Served, path: str, protocols: list[str]) -> tuple[dict[int, bytes], str]:
    """Run a remotecommand websocket session to its end: payload per channel, and the protocol."""
    received: dict[int, bytes] = defaultdict(bytes)
    async with trio_websocket.open_websocket("127.0.0.1", served.port, path, use_ssl=False,
                                             subprotocols=protocols) as ws:
        try:
            while True:
                message = await ws.get_message()
                if isinstance(message, str):  # base64.channel.k8s.io: digit, then base64
                    received[int(message[0])] += base64.b64decode(message[1:])
                else:
                    received[message[0]] += message[1:]
        except trio_websocket.ConnectionClosed:
            pass
        return received, ws.subprotocol or ""


async def test_exec_and_attach_over_websockets(containerd, tmp_path):
    with trio.fail_after(120):
        async with serving(containerd, tmp_path) as served:
            exec_path = f"/exec/default/{POD}/main?output=1&error=1"
            out, protocol = await channels(served, f"{exec_path}&command=echo&command=hello",
                                           ["v4.channel.k8s.io"])
            assert protocol == "v4.channel.k8s.io" and out[1] == b"hello\n"
            assert json.loads(out[3])["status"] == "Success"

            script = "echo%20oops%20%3E%262%3B%20exit%203"  # echo oops >&2; exit 3
            out, _ = await channels(
                served, f"{exec_path}&command=sh&command=-c&command={script}",
                ["v4.channel.k8s.io"])
            status = json.loads(out[3])
            assert out[2] == b"oops\n" and status["status"] == "Failure"
            assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]

            # v5 (what client-go's websocket executor asks for) is accepted and translated.
            out, protocol = await channels(served, f"{exec_path}&command=echo&command=v5",
                                           ["v5.channel.k8s.io", "v4.channel.k8s.io"])
            assert protocol == "v5.channel.k8s.io" and out[1] == b"v5\n"
            out, protocol = await channels(served, f"{exec_path}&command=echo&command=b64",
                                           ["base64.channel.k8s.io"])
            assert protocol == "base64.channel.k8s.io" and out[1] == b"b64\n"
            assert out[3] == b""  # channel.k8s.io (v1) reports success by saying nothing
            out, protocol = await channels(served, f"{exec_path}&command=echo&command=bare", [])
            assert protocol == "" and out[1] == b"bare\n"

            # stdin goes through: cat echoes it back, and the command ends when we close.
            async with trio_websocket.open_websocket(
                    "127.0.0.1", served.port, f"/exec/default/{POD}/main?input=1&output=1"
                    "&command=head&command=-n1", use_ssl=False,
                    subprotocols=["v4.channel.k8s.io"]) as ws:
                await ws.send_message(b"\x00typed\n")
                echoed = b""
                with trio.fail_after(10):
                    while b"typed\n" not in echoed:
                        message = await ws.get_message()
                        if message[0] == 1:
                            echoed += message[1:]

            # attach: the container's own output, while it runs. When the runtime has hooked
            # the attach up to the output is not observable from here, so the line is written
            # again every 0.5 s until one arrives.
            async def write_attached() -> None:
                while True:
                    await served.exec_in("main", "sh", "-c", "echo attached > /proc/1/fd/1")
                    await trio.sleep(0.5)

            async with trio_websocket.open_websocket(
                    "127.0.0.1", served.port, f"/attach/default/{POD}/main?output=1",
                    use_ssl=False, subprotocols=["v4.channel.k8s.io"]) as ws:
                seen = b""
                with trio.fail_after(10):
                    async with trio.open_nursery() as writing:
                        writing.start_soon(write_attached)
                        while b"attached\n" not in seen:
                            message = await ws.get_message()
                            seen += message[1:] if message[0] == 1 else b""
                        writing.cancel_scope.cancel()


async def test_an_idle_exec_session_is_closed_after_the_idle_timeout(containerd, tmp_path):
    config = KubeletConfiguration.model_validate({"streamingConnectionIdleTimeout": "2s"})
    with trio.fail_after(120):
        async with serving(containerd, tmp_path, config) as served:
            path = f"/exec/default/{POD}/main?output=1&command=sleep&command=300"
            began = trio.current_time()
            out, _ = await channels(served, path, ["v4.channel.k8s.io"])  # returns when closed
            assert 2 <= trio.current_time() - began < 30
            assert 3 not in out  # closed for idleness: sleep never exited, no status came

            # Data keeps a session open past the timeout.
            began = trio.current_time()
            script = ("for%20i%20in%201%202%203%204%205%206%3B%20do%20echo%20$i%3B%20sleep%201%3B"
                      "%20done")
            out, _ = await channels(served, f"/exec/default/{POD}/main?output=1&command=sh"
                                    f"&command=-c&command={script}", ["v4.channel.k8s.io"])
            assert out[1] == b"1\n2\n3\n4\n5\n6\n"
            assert json.loads(out[3])["status"] == "Success"
            assert trio.current_time() - began >= 5


async def test_streaming_bad_input(containerd, tmp_path, caplog):
    with trio.fail_after(90):
        async with serving(containerd, tmp_path) as served:
            for path, status in [
                ("/exec/default/nope/main?output=1&command=true", 404),
                (f"/exec/default/{POD}/nope?output=1&command=true", 404),
                (f"/exec/default/{POD}/main?command=true", 400),  # no stream at all
                (f"/exec/default/{POD}/main?output=1", 400),  # no command
                (f"/exec/default/{POD}/wrong-uid/main?output=1&command=true", 404),
                (f"/portForward/default/{POD}", 400),  # no port
                (f"/portForward/default/{POD}?port=http", 400),
            ]:
                with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                    async with trio_websocket.open_websocket(
                            "127.0.0.1", served.port, path, use_ssl=False,
                            subprotocols=["v4.channel.k8s.io"]):
                        pass
                assert rejected.value.status_code == status, path

            with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                async with trio_websocket.open_websocket(
                        "127.0.0.1", served.port, f"/exec/default/{POD}/main?output=1&command=true",
                        use_ssl=False, subprotocols=["chat"]):
                    pass
            assert rejected.value.status_code == 400

            # An SPDY upgrade the server cannot take (one with a body) is refused with an
            # explanation, not a hang.
            async with httpx.AsyncClient(base_url=served.base, timeout=10) as http:
                spdy = await http.post(f"/exec/default/{POD}/main?output=1&command=true",
                                       headers={"Connection": "Upgrade",
                                                "Upgrade": "SPDY/3.1",
                                                "X-Stream-Protocol-Version": "v4.channel.k8s.io"},
                                       content=b"x")
                assert spdy.status_code == 400
                assert "SPDY/3.1 upgrades are not supported" in spdy.text
                plain = await http.get(f"/exec/default/{POD}/main?output=1&command=true")
                assert plain.status_code == 400 and plain.text == "Upgrade request required"

            # A client that vanishes mid-session leaves no traceback behind.
            caplog.clear()
            async with trio_websocket.open_websocket(
                    "127.0.0.1", served.port,
                    f"/exec/default/{POD}/main?output=1&command=sleep&command=30",
                    use_ssl=False, subprotocols=["v4.channel.k8s.io"]) as ws:
                await trio.sleep(0.5)
                await ws._stream.aclose()  # drop the TCP connection, no close frame
            await trio.sleep(1)
            errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
            assert not errors, [r.getMessage() for r in errors]


async def test_run_executes_synchronously(containerd, tmp_path):
    with trio.fail_after(90):
        async with serving(containerd, tmp_path) as served, \
                httpx.AsyncClient(base_url=served.base, timeout=30) as http:
            ok = await http.post(f"/run/default/{POD}/main?cmd=echo%20ran")
            assert (ok.status_code, ok.content) == (200, b"ran\n")
            failed = await http.post(f"/run/default/{POD}/main?cmd=ls%20/nowhere")
            assert failed.status_code == 500 and "exited with 1" in failed.text
            assert (await http.get(f"/run/default/{POD}/main?cmd=true")).status_code == 405


async def test_port_forward_reaches_a_port_in_the_pod(containerd, tmp_path):
    with trio.fail_after(90):
        async with serving(containerd, tmp_path) as served:
            for protocol in ("v4.channel.k8s.io", "portforward.k8s.io"):
                async with trio_websocket.open_websocket(
                        "127.0.0.1", served.port, f"/portForward/default/{POD}?port=8080",
                        use_ssl=False, subprotocols=[protocol]) as ws:
                    assert ws.subprotocol == protocol
                    # Each channel (data 0, error 1) first carries the port, little-endian.
                    first = {(await ws.get_message())[0] for _ in range(2)}
                    assert first == {0, 1}
                    await ws.send_message(b"\x00ping\n")
                    data = b""
                    with trio.fail_after(10):
                        while b"hi\n" not in data:
                            message = await ws.get_message()
                            assert message[0] == 0, message
                            data += message[1:]
                    assert data == b"hi\n"

            # A port nobody listens on: the runtime's error arrives on the error channel.
            async with trio_websocket.open_websocket(
                    "127.0.0.1", served.port, f"/portForward/default/{POD}?port=9",
                    use_ssl=False, subprotocols=["v4.channel.k8s.io"]) as ws:
                frames: dict[int, bytes] = defaultdict(bytes)
                try:
                    while True:
                        message = await ws.get_message()
                        frames[message[0]] += message[1:]
                except trio_websocket.ConnectionClosed:
                    pass
            assert frames[1][:2] == struct.pack("<H", 9)
            assert b"connection refused" in frames[1]


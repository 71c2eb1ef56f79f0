"""SPDY/3.1 upgrades on the running agent's HTTPS port, relayed to containerd's streaming server.

There is no SPDY client here: what is checked is our part, that containerd accepts the upgrade
request we send on (its 101 names the protocol version it chose) or refuses it in its own words,
and that its answer reaches the client unchanged. Whole sessions run in tests/e2e/test_exec.py,
through the API server and kubectl.
"""

from __future__ import annotations

import ssl

import pytest
import trio

from tests.integration.harness import NODE, running, running_agent
from tests.net import free_port

pytestmark = pytest.mark.integration

POD = f"talk-{NODE}"
MANIFEST = """\
apiVersion: v1
kind: Pod
metadata: {name: talk}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: "busybox:1.36", command: [sleep, "3600"]}
"""


async def upgrade(port: int, target: str, *versions: str) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (lower-case names) and body of the answer to an SPDY upgrade request."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    stream = trio.SSLStream(await trio.open_tcp_stream("127.0.0.1", port), context)
    lines = [f"POST {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: Upgrade",
             "Upgrade: SPDY/3.1", *(f"X-Stream-Protocol-Version: {v}" for v in versions)]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    with trio.fail_after(20):
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *fields = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        if status_line.split()[1] != "101":
            while len(body) < int(headers.get("content-length", "0")):
                body += await stream.receive_some()
    await trio.aclose_forcefully(stream)
    return int(status_line.split()[1]), headers, body


async def test_spdy_upgrades_reach_containerd(containerd, tmp_path):
    port = free_port()
    flags = ("--address", "127.0.0.1", "--port", str(port), "--healthz-port", "0",
             "--authorization-mode", "AlwaysAllow", "--anonymous-auth=true")
    with trio.fail_after(120):
        async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
            agent.write("talk.yaml", MANIFEST)
            await agent.wait_for("talk", lambda p: running(p, "main"))

            status, headers, _ = await upgrade(
                port, f"/exec/default/{POD}/main?output=1&error=1&command=true",
                "v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io")
            assert status == 101
            assert headers["x-stream-protocol-version"] == "v4.channel.k8s.io"
            assert headers["upgrade"].lower() == "spdy/3.1"

            status, headers, _ = await upgrade(port, f"/attach/default/{POD}/main?output=1",
                                               "v4.channel.k8s.io")
            assert (status, headers["x-stream-protocol-version"]) == (101, "v4.channel.k8s.io")

            status, headers, _ = await upgrade(port, f"/portForward/default/{POD}",
                                               "portforward.k8s.io")
            assert (status, headers["x-stream-protocol-version"]) == (101, "portforward.k8s.io")

            # containerd 1.6 has no v5: its refusal is passed on as it gave it.
            status, _, body = await upgrade(
                port, f"/exec/default/{POD}/main?output=1&command=true", "v5.channel.k8s.io")
            assert status == 403 and b"v4.channel.k8s.io" in body, body

            status, _, body = await upgrade(port, "/exec/default/nope/main?output=1&command=true",
                                            "v4.channel.k8s.io")
            assert (status, body) == (404, b'pod "nope" in namespace "default" not found')

"""Container log rotation on a real containerd: a chatty container's CRI log is rotated at
--container-log-max-size, older files are gzipped, --container-log-max-files are kept, and
no line is lost across the files while the container keeps running."""

from __future__ import annotations

import gzip
from pathlib import Path

import httpx
import pytest
import trio

from tests.integration.harness import container, running, running_agent
from tests.net import free_port
from trio_kubelet import agent as agent_module
from trio_kubelet.replay.reader import read_recording
from trio_kubelet.replay.replayer import replay
from trio_kubelet.runtime import configs
from trio_kubelet.runtime.crilog import parse_chunk

pytestmark = pytest.mark.integration

MAX_FILES = 3
# ~150 bytes a line in the CRI format, ~50 lines a second: a 16 KiB log every ~2 s.
CHATTY = """\
apiVersion: v1
kind: Pod
metadata: {name: chatty}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox:1.36
    command:
    - sh
    - -c
    - |
      i=0
      pad=$(printf '%0100d' 0)
      while true; do i=$((i+1)); echo "line $i $pad"; sleep 0.02; done
"""


def rotated(log_dir: Path) -> list[str]:
    return sorted(p.name for p in log_dir.iterdir() if p.name != "0.log")


def line_numbers(data: bytes) -> list[int]:
    numbers = []
    for raw in data.splitlines():
        chunk = parse_chunk(raw)
        if chunk is not None and chunk.stream == "stdout":
            numbers.append(int(chunk.text.split()[1]))
    return numbers


async def test_a_chatty_log_is_rotated_compressed_and_kept_whole(containerd, tmp_path, monkeypatch):
    monkeypatch.setattr(agent_module, "LOG_MONITOR_PERIOD", 1.0)
    port = free_port()
    recording = tmp_path / "recording.jsonl"
    flags = ("--address", "127.0.0.1", "--port", str(port), "--authorization-mode",
             "AlwaysAllow", "--anonymous-auth=true", "--cgroups-per-qos=false",
             "--container-log-max-size=16Ki", f"--container-log-max-files={MAX_FILES}",
             "--record", str(recording))
    async with running_agent(containerd.endpoint, tmp_path, *flags) as agent:
        agent.write("chatty.yaml", CHATTY)
        pod = await agent.wait_for("chatty", lambda p: running(p, "main"), timeout=120)
        log_dir = (configs.pod_log_directory(tmp_path / "pod-logs", pod)
                   / configs.container_log_path("main", 0)).parent
        with trio.fail_after(90):  # a first compressed file: at least two rotations
            while not any(name.endswith(".gz") for name in rotated(log_dir)):
                await trio.sleep(0.5)
        await trio.sleep(6)  # a few more rotations, the oldest files removed
        status = container(agent.pod("chatty"), "main")
        assert status.state.running is not None and status.restart_count == 0
        async with httpx.AsyncClient(verify=False, timeout=10) as http:
            logs = f"https://127.0.0.1:{port}/containerLogs/default/chatty-itest-node/main"
            tail = (await http.get(f"{logs}?tailLines=1")).text
        assert tail.startswith("line "), tail
    # The agent is gone (the container writes on): the files hold still to be read.

    names = rotated(log_dir)
    assert len(names) + 1 <= MAX_FILES, names
    *packed, newest = names
    assert packed and all(name.endswith(".gz") for name in packed), names
    assert newest.startswith("0.log.") and not newest.endswith(".gz"), names
    # Oldest to newest, the files hold one unbroken run of lines: nothing was lost between a
    # rename and the runtime's reopen.
    numbers = [n for name in packed
               for n in line_numbers(gzip.decompress((log_dir / name).read_bytes()))]
    numbers += line_numbers((log_dir / newest).read_bytes())
    numbers += line_numbers((log_dir / "0.log").read_bytes())
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers[:5]
    assert numbers[0] > 1, "the oldest rotated files were removed"
    assert int(tail.split()[1]) <= numbers[-1]

    result = replay(read_recording(recording).records)
    assert result.ok, result.divergence and result.divergence.diff
    assert result.log_rotations >= 3

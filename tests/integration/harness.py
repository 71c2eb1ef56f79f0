"""Running the agent in-process against the test containerd, and waiting on what it reports."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from tests.net import free_port
from trio_kubelet.agent import run_agent
from trio_kubelet.cli import parse_run_options
from trio_kubelet.model.pod import ContainerStatus, Pod
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.runtime import configs
from trio_kubelet.runtime.crilog import parse_chunk
from trio_kubelet.status.store import PodStatusStore

NODE = "itest-node"


@dataclass
class RunningAgent:
    store: PodStatusStore
    loop: SyncLoop
    manifests: Path
    logs: Path

    def write(self, filename: str, manifest: str) -> Path:
        """Write a manifest atomically (a rename), as an operator's editor would."""
        path = self.manifests / filename
        tmp = self.manifests / f".{filename}.tmp"
        tmp.write_text(textwrap.dedent(manifest))
        tmp.rename(path)
        return path

    def pod(self, name: str) -> Pod | None:
        """The pod a manifest named ``name`` became (static pods get the node name appended)."""
        for pod in self.store.pods():
            if pod.metadata.name == f"{name}-{NODE}":
                return pod
        return None

    async def wait_for(
        self, name: str, predicate: Callable[[Pod], bool], timeout: float = 60.0
    ) -> Pod:
        """Wait until the named pod's status satisfies ``predicate``; fail with the last status."""
        with trio.move_on_after(timeout):
            while True:
                pod = self.pod(name)
                if pod is not None and predicate(pod):
                    return pod
                await self.store.wait_changed()
        pod = self.pod(name)
        raise AssertionError(
            f"pod {name} did not reach the expected state in {timeout}s; last status: "
            f"{pod.status.model_dump_json(by_alias=True, exclude_none=True) if pod else 'absent'}"
        )

    def output(self, pod: Pod, name: str, restart: int = 0) -> list[str]:
        """What a container instance wrote to stdout, line by line, from its CRI log file."""
        path = configs.pod_log_directory(self.logs, pod) / configs.container_log_path(name, restart)
        lines = []
        for raw in path.read_bytes().splitlines():
            chunk = parse_chunk(raw)
            if chunk is not None and chunk.stream == "stdout":
                lines.append(chunk.text.decode())
        return lines

    async def wait_gone(self, name: str, timeout: float = 60.0) -> None:
        with trio.move_on_after(timeout):
            while self.pod(name) is not None:
                await self.store.wait_changed()
            return
        raise AssertionError(f"pod {name} still present after {timeout}s")


@asynccontextmanager
async def running_agent(
    endpoint: str, tmp_path: Path, *extra_flags: str
) -> AsyncIterator[RunningAgent]:
    """Start the agent with a fresh manifest directory; cancel it on exit (pods keep running)."""
    manifests = tmp_path / "manifests"
    manifests.mkdir(exist_ok=True)
    logs = tmp_path / "pod-logs"
    root = tmp_path / "root"
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\n"
        f"podLogsDir: {logs}\n"
        "fileCheckFrequency: 20s\n"
    )
    options = parse_run_options(
        [
            "--config",
            str(config),
            "--pod-manifest-path",
            str(manifests),
            "--container-runtime-endpoint",
            endpoint,
            "--root-dir",
            str(root),
            "--hostname-override",
            NODE,
            "--node-ip",
            "127.0.0.1",
            *_private_ports(extra_flags),
            *extra_flags,
        ]
    )
    store = PodStatusStore()
    async with trio.open_nursery() as nursery:
        loop = await nursery.start(
            lambda task_status: run_agent(options, store=store, task_status=task_status)
        )
        yield RunningAgent(store=store, loop=loop, manifests=manifests, logs=logs)
        nursery.cancel_scope.cancel()


def container(pod: Pod, name: str) -> ContainerStatus:
    for status in (*pod.status.init_container_statuses, *pod.status.container_statuses):
        if status.name == name:
            return status
    raise AssertionError(f"no status for container {name} in pod {pod.metadata.name}")


def running(pod: Pod, name: str) -> bool:
    try:
        return container(pod, name).state.running is not None
    except AssertionError:
        return False


def _private_ports(flags: tuple[str, ...]) -> list[str]:
    """Free ports on 127.0.0.1 for the servers the test does not place itself, so that tests
    never need (or collide on) the kubelet's fixed 10250 and 10248."""
    chosen = []
    if "--port" not in flags:
        chosen += ["--address", "127.0.0.1", "--port", str(free_port())]
    if "--healthz-port" not in flags:
        chosen += ["--healthz-port", "0"]
    return chosen

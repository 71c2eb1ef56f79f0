"""A container killed (SIGKILL) → its replacement running: with the event stream, relists only.

Runs the agent as its own process (``python -m trio_kubelet``) on a private containerd
(``scripts/containerd-env``; containerd 2.x by default, whose CRI streams container events)
with N static pods (busybox ``sleep 3600``), once per PLEG mode, each on a fresh containerd:

- ``stream``: the default, the runtime's container event stream (GetContainerEvents);
- ``relist``: ``--feature-gates EventedPLEG=false``, a relist every second (what the Go
  kubelet does by default, and what trio-kubelet does on containerd 1.6).

Once every pod runs, it kills K different pods' containers one after the other (each pod once,
so no crash-loop back-off is involved): the container's process gets SIGKILL from this process
(its pid from the runtime's verbose ContainerStatus), and the time until the runtime lists a
new RUNNING container of that pod is the figure (polled every 10 ms through a CRI client of
this process, so it includes up to ~10 ms of polling). Then it waits ``--gap`` seconds plus a
random part of a second (seeded) before the next kill: without it every kill would fall at the
same point of the one-second relist cycle (just after the relist that found the previous
replacement), and relists alone would always take the longest, ~1 s.

Prints one JSON object with p50/p99/min/max per mode (with 10 kills p99 is the worst one) and
the load average. Usage: ``python bench/bench_kill_restart.py [--containerd 2|1] [--pods 20]
[--kills 10] [--modes stream,relist]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from bench_steady_state import (
    IMAGE,
    NODE,
    containerd_unavailable,
    private_containerd,
    sleep_pod_manifest,
    start_agent,
    stop_process,
    tree_version,
    wait_all_running,
)

from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient, open_cri_client
from trio_kubelet.runtime.cri.runtime import v1

POLL = 0.01
MODES = {"stream": [], "relist": ["--feature-gates", "EventedPLEG=false"]}


async def running_container(client: CRIClient, pod_name: str) -> v1.Container | None:
    containers = await client.list_containers(v1.ContainerFilter(
        state=v1.ContainerStateValue(state=v1.ContainerState.CONTAINER_RUNNING),
        label_selector={labels.POD_NAME: pod_name}))
    return containers[0] if containers else None


async def kill_and_wait(endpoint: str, pod_name: str, timeout: float) -> float:
    """SIGKILL the pod's running container; seconds until another one of it runs."""
    async with open_cri_client(endpoint, timeout=30) as client:
        victim = await running_container(client, pod_name)
        if victim is None:
            raise RuntimeError(f"{pod_name} has no running container")
        status = await client.container_status(victim.id, verbose=True)
        pid = json.loads(status.info["info"])["pid"]
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        with trio.fail_after(timeout):
            while True:
                now = await running_container(client, pod_name)
                if now is not None and now.id != victim.id:
                    return time.monotonic() - killed
                await trio.sleep(POLL)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def write_pods(workdir: Path, prefix: str, pods: int) -> tuple[Path, list[str]]:
    """``pods`` static pod manifests in ``workdir/manifests``; the directory and pod names."""
    manifests = workdir / "manifests"
    manifests.mkdir()
    names = [f"{prefix}-{index:03d}" for index in range(pods)]
    for name in names:
        (manifests / f"{name}.yaml").write_text(sleep_pod_manifest(name, IMAGE, prefix))
    return manifests, names


def kill_each(endpoint: str, names: list[str], gap: float) -> list[float]:
    """`kill_and_wait` for each pod in turn, ``gap`` plus a random part of a second apart."""
    samples = []
    phase = random.Random(len(names))
    for name in names:
        samples.append(trio.run(kill_and_wait, endpoint, f"{name}-{NODE}", 60.0))
        time.sleep(gap + phase.random())
    return samples


def run_mode(mode: str, major: int, pods: int, kills: int, gap: float,
             start_timeout: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="tkb-kill-run-", dir="/tmp"))
    manifests, names = write_pods(workdir, "kill", pods)
    agent_log = workdir / "agent.log"
    result: dict[str, Any] = {"load_1m_before": round(os.getloadavg()[0], 2)}
    try:
        # A fresh containerd per mode: what one run leaves changes the next one's decisions.
        with private_containerd(major) as (endpoint, _), agent_log.open("w") as log:
            agent = start_agent(manifests, endpoint, workdir, log, *MODES[mode])
            try:
                wait_all_running(endpoint, pods, agent, start_timeout, agent_log)
                time.sleep(gap)
                samples = kill_each(endpoint, names[:kills], gap)
            finally:
                stop_process(agent)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result.update({
        "p50_s": round(statistics.median(samples), 3),
        "p99_s": round(percentile(samples, 0.99), 3),
        "min_s": round(min(samples), 3),
        "max_s": round(max(samples), 3),
        "samples_s": [round(s, 3) for s in samples],
        "load_1m_after": round(os.getloadavg()[0], 2),
    })
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containerd", type=int, choices=(1, 2), default=2,
                        help="Debian's 1.6 or 2.x (scripts/build-containerd2)")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--gap", type=float, default=3.0, help="wait after each kill (s)")
    parser.add_argument("--modes", default="stream,relist")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "kill_restart", "containerd": args.containerd,
                              "pods": args.pods, "kills": args.kills}
    skip = containerd_unavailable()
    if skip is not None or args.kills > args.pods:
        result["skipped"] = skip or "--kills must not exceed --pods (each pod is killed once)"
        print(json.dumps(result))
        return
    for mode in args.modes.split(","):
        result[mode] = run_mode(mode, args.containerd, args.pods, args.kills, args.gap,
                                args.start_timeout)
    result["tree"] = tree_version()
    result["cpus"] = os.cpu_count()
    result["python"] = platform.python_version()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Benchmark one container GC pass over 2,000 dead containers on the fake runtime (target ≤ 1 s).

The fake runs in a child process, so the CPU figures are the agent side's alone. Two shapes,
each with ``--dead`` dead containers (default 2,000, every one with its CRI log file):

- ``steady``: 200 existing pods, one container each, crash-looped 10 times, and a policy that
  keeps 10 dead instances per container: the pass finds nothing to remove (the cost of the
  minutely pass on a node holding that many dead containers);
- ``crash_loops``: the same node with the default policy: the pass keeps the newest dead
  instance of each container (200) and removes the rest (1,800 containers, 1,800 log files),
  one RemoveContainer each;
- ``gone_pods``: 200 pods no source wants any more, 10 dead instances each in a stopped
  sandbox; the pass removes every container (with its sandbox: one RemovePodSandbox each),
  sandbox and pod log directory.

Per pass: wall time, agent CPU, and the pure choice (`plan_container_gc`) alone. Removals
run ``--concurrency`` at a time (the agent's default unless given).

Prints one JSON object. Usage:
``python bench/bench_container_gc.py [--dead 2000] [--runs 3] [--concurrency 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import trio
from bench_steady_state import tree_version
from fake_runtime_server import fake_process

from trio_kubelet.core.container_gc import GCPolicy, plan_container_gc
from trio_kubelet.reconcile import container_gc
from trio_kubelet.reconcile.container_gc import ContainerGC, _gc_container, _gc_sandbox
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import FakeRuntime

PODS = 200
IMAGE = "registry.local/app:v1"


def populate(fake: FakeRuntime, *, logs: Path, dead: int, stop_sandboxes: bool) -> None:
    """``PODS`` pods with ``dead // PODS`` exited instances of one container each."""
    fake.add_image(IMAGE)
    per_pod = dead // PODS
    for p in range(PODS):
        name, uid = f"pod-{p}", f"uid-{p:04d}"
        log_dir = logs / f"bench_{name}_{uid}"
        (log_dir / "main").mkdir(parents=True)
        config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name=name, uid=uid, namespace="bench"),
            log_directory=str(log_dir),
            labels=labels.sandbox_labels(uid, name, "bench", {"app": "bench"}))
        sandbox_id = fake.run_pod_sandbox(v1.RunPodSandboxRequest(config=config)).pod_sandbox_id
        for restart in range(per_pod):
            container = v1.ContainerConfig(
                metadata=v1.ContainerMetadata(name="main", attempt=restart),
                image=v1.ImageSpec(image=IMAGE),
                log_path=f"main/{restart}.log",
                labels=labels.container_labels(uid, name, "bench", "main"),
                annotations=labels.container_annotations(f"{p:016x}", restart, "regular", 30))
            container_id = fake.create_container(v1.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=container,
                sandbox_config=config)).container_id
            fake.start_container(v1.StartContainerRequest(container_id=container_id))
            fake.crash(container_id)
        if stop_sandboxes:
            fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))


def one_pass(dead: int, gone: bool, policy: GCPolicy) -> dict[str, Any]:
    """Populate a fresh fake, then time one GC pass and the pure choice over the same lists."""
    with tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp:
        sock, logs = str(Path(tmp) / "cri.sock"), Path(tmp) / "logs"
        existing = set() if gone else {f"uid-{p:04d}" for p in range(PODS)}
        # Distinct, increasing creation times without waiting: the fake reads this clock.
        ticks = iter(range(1_700_000_000, 1_800_000_000))
        fill = partial(populate, logs=logs, dead=dead, stop_sandboxes=gone)
        with fake_process(sock, fill, clock=lambda: float(next(ticks))):

            async def run() -> dict[str, Any]:
                async with open_cri_client(sock) as client:
                    sandboxes = await client.list_pod_sandbox_brief()
                    containers = await client.list_containers_brief()
                    start = time.perf_counter()
                    plan = plan_container_gc(
                        [_gc_container(c) for c in containers],
                        [_gc_sandbox(s) for s in sandboxes],
                        policy=policy, now=2e9, existing_pods=existing,
                        sources_ready=True, log_dirs=os.listdir(logs))
                    plan_ms = (time.perf_counter() - start) * 1000
                    gc = ContainerGC(client, policy, existing_pods=lambda: existing,
                                     sources_ready=lambda: True, pod_logs_dir=logs,
                                     clock=lambda: 2e9)
                    cpu, wall = time.process_time(), time.perf_counter()
                    result = await gc.collect()
                    wall_s = time.perf_counter() - wall
                    cpu_s = time.process_time() - cpu
                    left = len(await client.list_containers_brief())
                return {
                    "wall_s": round(wall_s, 3), "agent_cpu_s": round(cpu_s, 3),
                    "plan_ms": round(plan_ms, 1), "dead": result.dead,
                    "removed_containers": result.containers, "planned": len(plan.containers),
                    "removed_sandboxes": result.sandboxes, "removed_log_dirs": result.log_dirs,
                    "failed": result.failed, "containers_left": left,
                    "log_files_left": sum(1 for _ in logs.glob("*/main/*.log")),
                }

            return trio.run(run)


def summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [p["wall_s"] for p in passes]
    return {"wall_s_median": round(statistics.median(walls), 3), "wall_s_max": max(walls),
            "agent_cpu_s_median": round(statistics.median(p["agent_cpu_s"] for p in passes), 3),
            "plan_ms_median": round(statistics.median(p["plan_ms"] for p in passes), 1),
            "passes": passes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dead", type=int, default=2000, help="dead containers on the node")
    parser.add_argument("--runs", type=int, default=3, help="passes per shape, each on a new fake")
    parser.add_argument("--concurrency", type=int, default=container_gc.REMOVAL_CONCURRENCY,
                        help="removals in flight at once")
    args = parser.parse_args()
    container_gc.REMOVAL_CONCURRENCY = args.concurrency
    load_at_start = round(os.getloadavg()[0], 2)
    report: dict[str, Any] = {"bench": "container_gc", "dead": args.dead,
                              "concurrency": args.concurrency}
    keep_all = GCPolicy(max_per_pod_container=args.dead // PODS)
    shapes = (("steady", False, keep_all), ("crash_loops", False, GCPolicy()),
              ("gone_pods", True, GCPolicy()))
    for shape, gone, policy in shapes:
        report[shape] = summary([one_pass(args.dead, gone, policy) for _ in range(args.runs)])
    report["target_s"] = 1.0
    report["tree"] = tree_version()
    report["loadavg_1m_at_start"] = load_at_start
    report["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

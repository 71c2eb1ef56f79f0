"""Benchmark the PLEG relist (ListPodSandbox + ListContainers + grouping) against the fake runtime.

The fake runs in a child process, so the CPU figures are the agent side's alone (client, grpclib,
the asyncio thread hop, decoding, grouping). Two shapes are measured: ``--pods`` x ``--containers``
(default 50 x 5 = 250 containers) and 110 pods x 1 container (220 objects, the steady-state CPU
target: at most 3 % of a core with a 1 s relist period). For each, the relist as the agent does it
(upb-decoded ``*_brief`` list calls, `runtime.inspect.relist`) and the previous path (the same two
calls decoded by betterproto2, grouping not included) are timed.

Prints one JSON object. Usage:
``python bench/bench_pleg_relist.py [--pods 50] [--containers 5] [--relists 200]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import trio
from google.protobuf.internal import api_implementation

from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient, open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2 as upb
from trio_kubelet.runtime.fake import FakeRuntime, serve_fake_runtime
from trio_kubelet.runtime.inspect import group_by_pod, relist

STEADY_PODS = 110  # the steady-state CPU target's node: 110 pods, one container each
PERIOD_S = 1.0  # PLEG relist period of that target


def populate(fake: FakeRuntime, pods: int, containers: int) -> None:
    """Fill the fake in-process (setup is not what is measured)."""
    fake.add_image("registry.local/app:v1")
    for p in range(pods):
        name, uid = f"pod-{p}", f"uid-{p:04d}"
        config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name=name, uid=uid, namespace="bench"),
            log_directory=f"/var/log/pods/bench_{name}_{uid}",
            labels=labels.sandbox_labels(uid, name, "bench", {"app": "bench", "tier": "web"}))
        sandbox_id = fake.run_pod_sandbox(v1.RunPodSandboxRequest(config=config)).pod_sandbox_id
        for c in range(containers):
            cname = f"c{c}"
            container = v1.ContainerConfig(
                metadata=v1.ContainerMetadata(name=cname),
                image=v1.ImageSpec(image="registry.local/app:v1"),
                log_path=f"{cname}/0.log",
                labels=labels.container_labels(uid, name, "bench", cname),
                annotations=labels.container_annotations(f"{p:08x}{c:08x}", 0, "regular", 30))
            container_id = fake.create_container(v1.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=container,
                sandbox_config=config)).container_id
            fake.start_container(v1.StartContainerRequest(container_id=container_id))


def _serve(sock: str, pods: int, containers: int, ready: Event, done: Event) -> None:
    """Child process: a populated fake runtime on ``sock`` until ``done`` is set."""

    async def main() -> None:
        async with serve_fake_runtime(sock) as fake:
            populate(fake, pods, containers)
            ready.set()
            while not done.is_set():
                await trio.sleep(0.05)

    trio.run(main)


@contextmanager
def fake_process(sock: str, pods: int, containers: int) -> Iterator[None]:
    context = multiprocessing.get_context("fork")  # before any trio loop runs in this process
    ready, done = context.Event(), context.Event()
    child = context.Process(target=_serve, args=(sock, pods, containers, ready, done))
    child.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the fake runtime did not start")
        yield
    finally:
        done.set()
        child.join(10)


def _mean_ms(fn: Callable[[], object], times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - start) * 1000 / times


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _relist_betterproto2(client: CRIClient) -> int:
    """The relist's two calls as they were before: replies decoded into betterproto2."""
    sandboxes = await client.list_pod_sandbox()
    containers = await client.list_containers()
    return len(sandboxes) + len(containers)


async def _time(fn: Callable[[], Any], times: int) -> dict[str, float]:
    for _ in range(min(10, times)):  # warm up connection and caches
        await fn()
    wall: list[float] = []
    cpu_start = time.process_time()
    for _ in range(times):
        start = time.perf_counter()
        await fn()
        wall.append((time.perf_counter() - start) * 1000)
    cpu_ms = (time.process_time() - cpu_start) * 1000 / times
    return {"p50_ms": round(percentile(wall, 0.5), 2), "p99_ms": round(percentile(wall, 0.99), 2),
            "mean_ms": round(statistics.fmean(wall), 2), "cpu_ms": round(cpu_ms, 2)}


def measure(pods: int, containers: int, relists: int, old_relists: int) -> dict[str, Any]:
    """Relist timings through a real socket plus offline decode/grouping costs."""
    with tempfile.TemporaryDirectory(prefix="bench-cri-") as tmp:
        sock = str(Path(tmp) / "cri.sock")
        with fake_process(sock, pods, containers):

            async def run() -> tuple[dict[str, float], dict[str, float], int, int]:
                async with open_cri_client(sock) as client:
                    result = await relist(client)
                    new = await _time(lambda: relist(client), relists)
                    old = await _time(lambda: _relist_betterproto2(client), old_relists)
                return new, old, len(result), sum(len(p.containers) for p in result.values())

            new, old, pod_count, container_count = trio.run(run)

    # Offline: the same replies, decoded both ways, and grouping alone.
    fake = FakeRuntime()
    populate(fake, pods, containers)
    wire = fake.list_containers_wire(v1.ListContainersRequest())
    sandbox_wire = fake.list_pod_sandbox_wire(v1.ListPodSandboxRequest())
    listed = upb.ListContainersResponse.FromString(wire).containers
    sandboxes = upb.ListPodSandboxResponse.FromString(sandbox_wire).items
    return {
        "pods": pod_count,
        "containers": container_count,
        "relists": relists,
        "relist_p50_ms": new["p50_ms"],
        "relist_p99_ms": new["p99_ms"],
        "relist_mean_ms": new["mean_ms"],
        # Agent-side CPU per relist (the fake is another process).
        "relist_cpu_ms": new["cpu_ms"],
        "betterproto2_relist_p50_ms": old["p50_ms"],
        "betterproto2_relist_p99_ms": old["p99_ms"],
        "betterproto2_relist_cpu_ms": old["cpu_ms"],
        # Where the time goes: decoding the ListContainers reply, and grouping decoded replies.
        "decode_list_containers_ms": {
            "betterproto2": round(_mean_ms(lambda: v1.ListContainersResponse.parse(wire), 10), 2),
            "upb": round(_mean_ms(lambda: upb.ListContainersResponse.FromString(wire), 200), 3),
        },
        "group_by_pod_ms": round(_mean_ms(lambda: group_by_pod(sandboxes, listed), 100), 2),
        "list_containers_reply_bytes": len(wire),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--containers", type=int, default=5, help="containers per pod")
    parser.add_argument("--relists", type=int, default=200)
    parser.add_argument("--old-relists", type=int, default=30,
                        help="relists timed on the betterproto2 path (slow)")
    args = parser.parse_args()
    report = measure(args.pods, args.containers, args.relists, args.old_relists)
    steady = measure(STEADY_PODS, 1, args.relists, args.old_relists)
    steady["cpu_percent_of_a_core_at_1s_period"] = round(
        steady["relist_cpu_ms"] / (PERIOD_S * 1000) * 100, 2)
    report[f"pods_{STEADY_PODS}"] = steady
    report["protobuf_backend"] = api_implementation.Type()
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""Benchmark the PLEG relist (ListPodSandbox + ListContainers + grouping) against the fake runtime.

Prints one JSON object: container count and relist latency percentiles in ms.
Usage: ``python bench/bench_pleg_relist.py [--pods 50] [--containers 5] [--relists 200]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import FakeRuntime, serve_fake_runtime
from trio_kubelet.runtime.inspect import relist


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


def _mean_ms(fn: Callable[[], object], times: int) -> float:
    start = time.perf_counter()
    for _ in range(times):
        fn()
    return (time.perf_counter() - start) * 1000 / times


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(pods: int, containers: int, relists: int) -> dict[str, float | int]:
    with tempfile.TemporaryDirectory(prefix="bench-cri-") as tmp:
        sock = Path(tmp) / "cri.sock"
        async with serve_fake_runtime(sock) as fake, open_cri_client(str(sock)) as client:
            populate(fake, pods, containers)
            for _ in range(10):  # warm up connection and caches
                await relist(client)
            samples = []
            for _ in range(relists):
                start = time.perf_counter()
                result = await relist(client)
                samples.append((time.perf_counter() - start) * 1000)
            total = sum(len(p.containers) for p in result.values())
            request = v1.ListContainersRequest()
            wire = fake.list_containers_wire(request)
            serve_ms = _mean_ms(lambda: fake.list_containers_wire(request), 50)
            decode_ms = _mean_ms(lambda: v1.ListContainersResponse.parse(wire), 20)
    return {
        "containers": total,
        "pods": len(result),
        "relists": relists,
        "relist_p50_ms": round(percentile(samples, 0.5), 2),
        "relist_p99_ms": round(percentile(samples, 0.99), 2),
        "relist_mean_ms": round(statistics.fmean(samples), 2),
        # Where the time goes: the fake's answer vs decoding it into betterproto2 messages.
        "fake_list_containers_ms": round(serve_ms, 3),
        "decode_list_containers_ms": round(decode_ms, 2),
        "list_containers_reply_bytes": len(wire),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--containers", type=int, default=5, help="containers per pod")
    parser.add_argument("--relists", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(trio.run(run, args.pods, args.containers, args.relists)))


if __name__ == "__main__":
    main()

"""Benchmark one image GC pass over 500 images on the fake runtime (target ≤ 1 s).

The fake runs in a child process, so the CPU figures are the agent side's alone. The node
holds ``--images`` images (default 500, 1-10 MB each) of which 100 are used by containers
(one pod each) and the rest are unused; the image filesystem is stubbed so the thresholds
ask for what each shape needs:

- ``below_threshold``: usage under imageGCHighThresholdPercent: the pass lists, updates its
  records and removes nothing (the cost of the 5-minute pass on most nodes);
- ``free_to_low``: usage over the high threshold, and freeing down to the low one takes
  half of the unused images, least recently used first (one RemoveImage each);
- ``reclaim``: the eviction manager's node-level reclaim: every unused image goes.

Per pass: wall time, agent CPU, the fake runtime's CPU (its serving is most of the wall
time: one RemoveImage per image), images removed, and the pure choice (`plan_image_gc`)
alone over the same records. Prints one JSON object. Usage:
``python bench/bench_image_gc.py [--images 500] [--runs 3]``.
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
from fake_runtime_server import fake_process, process_cpu_s

from trio_kubelet.core.image_gc import ImageFs, ImageGCPolicy, plan_image_gc
from trio_kubelet.images.gc import ImageGC
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.fake import FakeRuntime

USED = 100  # images with a container
MB = 10**6
POLICY = ImageGCPolicy(high_threshold_percent=85, low_threshold_percent=80, minimum_age=0)


def image_size(index: int) -> int:
    return (1 + index % 10) * MB


def populate(fake: FakeRuntime, *, images: int) -> None:
    """``images`` images; the first ``USED`` each run by a container of its own pod."""
    for index in range(images):
        ref = f"registry.local/bench/app{index}:v1"
        fake.add_image(ref, size=image_size(index))
        if index >= USED:
            continue
        name, uid = f"pod-{index}", f"uid-{index:04d}"
        config = v1.PodSandboxConfig(
            metadata=v1.PodSandboxMetadata(name=name, uid=uid, namespace="bench"),
            labels=labels.sandbox_labels(uid, name, "bench", {}))
        sandbox = fake.run_pod_sandbox(v1.RunPodSandboxRequest(config=config)).pod_sandbox_id
        container = fake.create_container(v1.CreateContainerRequest(
            pod_sandbox_id=sandbox, sandbox_config=config,
            config=v1.ContainerConfig(metadata=v1.ContainerMetadata(name="main"),
                                      image=v1.ImageSpec(image=ref)))).container_id
        fake.start_container(v1.StartContainerRequest(container_id=container))


def filesystem(images: int, shape: str) -> ImageFs:
    """An image filesystem whose usage makes ``shape`` happen."""
    unused = sum(image_size(i) for i in range(USED, images))
    capacity = 100 * unused  # the unused images are 1 % of the disk
    if shape == "below_threshold":
        return ImageFs(capacity, capacity // 2)  # 50 % used
    # 80.5 % used; down to 80 % means freeing half the unused images' bytes.
    return ImageFs(capacity, capacity * 20 // 100 - unused // 2)


def one_pass(images: int, shape: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-image-gc-") as tmp:
        sock = str(Path(tmp) / "cri.sock")
        with fake_process(sock, partial(populate, images=images)) as fake_pid:

            async def run() -> dict[str, Any]:
                fs = filesystem(images, shape)
                policy = ImageGCPolicy(80 if shape == "free_to_low" else 85, 80, minimum_age=0)

                async def image_fs() -> ImageFs:
                    return fs

                async with open_cri_client(sock) as client:
                    gc = ImageGC(client, policy, image_fs=image_fs)
                    cpu, wall = time.process_time(), time.perf_counter()
                    fake_cpu = process_cpu_s(fake_pid)
                    if shape == "reclaim":
                        await gc.reclaim("imagefs.available")
                    else:
                        await gc.collect()
                    wall_s = time.perf_counter() - wall
                    cpu_s = time.process_time() - cpu
                    fake_cpu_s = process_cpu_s(fake_pid) - fake_cpu
                    left = len(await client.list_images())
                    records = gc.records
                    in_use = {r.id for r in records.values() if r.last_used > 0}
                    start = time.perf_counter()
                    plan_image_gc(records, in_use, fs, trio.current_time(), policy, 0.0)
                    plan_ms = (time.perf_counter() - start) * 1000
                return {"wall_s": round(wall_s, 3), "agent_cpu_s": round(cpu_s, 3),
                        "fake_runtime_cpu_s": round(fake_cpu_s, 3),
                        "plan_ms": round(plan_ms, 2), "removed": images - left,
                        "images_left": left}

            return trio.run(run)


def summary(passes: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [p["wall_s"] for p in passes]
    return {"wall_s_median": round(statistics.median(walls), 3), "wall_s_max": max(walls),
            "agent_cpu_s_median": round(statistics.median(p["agent_cpu_s"] for p in passes), 3),
            "fake_runtime_cpu_s_median": round(
                statistics.median(p["fake_runtime_cpu_s"] for p in passes), 3),
            "plan_ms_median": round(statistics.median(p["plan_ms"] for p in passes), 2),
            "passes": passes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500, help="images on the node")
    parser.add_argument("--runs", type=int, default=3, help="passes per shape, each on a new fake")
    args = parser.parse_args()
    load_at_start = round(os.getloadavg()[0], 2)
    report: dict[str, Any] = {"bench": "image_gc", "images": args.images, "used": USED}
    for shape in ("below_threshold", "free_to_low", "reclaim"):
        report[shape] = summary([one_pass(args.images, shape) for _ in range(args.runs)])
    report["target_s"] = 1.0
    report["tree"] = tree_version()
    report["loadavg_1m_at_start"] = load_at_start
    report["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""Throughput of compute_pod_actions on one core: a steady 3-container pod and a crash-looping one.

Prints one JSON object; the target is at least 20,000 calls/s for the steady pod.
Run: ``PYTHONPATH=src python bench/bench_compute_pod_actions.py [--seconds N]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Mapping

from trio_kubelet.core.actions import compute_pod_actions
from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.model.pod import Pod


def _pod() -> Pod:
    return Pod.model_validate({
        "metadata": {"name": "web", "namespace": "default", "uid": "uid-1"},
        "spec": {
            "containers": [
                {"name": "app", "image": "nginx:1.27",
                 "livenessProbe": {"httpGet": {"port": 80}}},
                {"name": "log", "image": "busybox:1.36", "command": ["tail", "-F", "/x"]},
                {"name": "metrics", "image": "prom/exporter:v1"},
            ],
        },
    })


def _status(pod: Pod, crashing: bool) -> RuntimePodStatus:
    containers = []
    for index, container in enumerate(pod.spec.containers):
        failed = crashing and index == 0
        containers.append(RuntimeContainer(
            id=f"c{index}",
            name=container.name,
            state=ContainerState.EXITED if failed else ContainerState.RUNNING,
            spec_hash=container_hash(container),
            restart_count=7 if failed else 0,
            exit_code=1 if failed else 0,
            reason="Error" if failed else "",
        ))
    sandbox = RuntimeSandbox(id="s1", state=SandboxState.READY, ip="10.1.0.5")
    return RuntimePodStatus(uid="uid-1", name="web", namespace="default",
                            sandboxes=(sandbox,), containers=tuple(containers))


def _rate(call: Callable[[], object], seconds: float) -> float:
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(1000):
            call()
        calls += 1000
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per scenario")
    args = parser.parse_args()
    pod = _pod()
    steady = _status(pod, crashing=False)
    crashing = _status(pod, crashing=True)
    liveness: Mapping[str, ProbeResult] = {"c0": ProbeResult.SUCCESS}
    assert not compute_pod_actions(pod, steady, liveness=liveness).containers_to_start
    assert compute_pod_actions(pod, crashing, liveness=liveness).containers_to_start == [0]
    steady_rate = _rate(lambda: compute_pod_actions(pod, steady, liveness=liveness), args.seconds)
    crash_rate = _rate(lambda: compute_pod_actions(pod, crashing, liveness=liveness),
                       args.seconds)
    print(json.dumps({
        "calls_per_s": round(steady_rate),
        "crash_loop_calls_per_s": round(crash_rate),
        "us_per_call": round(1e6 / steady_rate, 2),
        "crash_loop_us_per_call": round(1e6 / crash_rate, 2),
        "containers": len(pod.spec.containers),
        "target_calls_per_s": 20000,
        "python": platform.python_version(),
    }))


if __name__ == "__main__":
    main()

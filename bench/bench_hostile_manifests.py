"""Hostile manifests: what reading each costs, and whether the event loop keeps answering.

Three measurements, no container runtime needed:

- ``shapes``: each known hostile shape (``tests/fuzz/manifests.py: HOSTILE``: deep JSON,
  alias bombs, 20,000 empty documents, 1 MB and 10 MB annotations, 20,000 containers) read
  from a file as the static source reads it: wall time, the peak RSS growth while it is
  read (``VmHWM`` reset first), the longest the GIL was held (a second thread wakes every
  millisecond and records its longest wait), and the refusal.
- ``healthz``: the static source (``run_static_files``) and the healthz server in one trio
  process, as in the agent; a process of its own (``tests/healthz_poller.py``) asks
  ``/healthz`` every 10 ms while every hostile file is dropped into the manifest directory
  at once. p50/p99/max latency, and the process's peak RSS growth.
- ``fuzz``: building and reading 10,000 fuzzed manifests (``build_manifest`` on seeded random
  bytes, then ``parse_manifest``), the work of the fuzz tier without hypothesis.

Prints one JSON object; needs /proc (Linux) and root for ``/proc/self/clear_refs``.
Usage: ``python bench/bench_hostile_manifests.py [--fuzz 10000]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, cast

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fuzz.manifests import HOSTILE, build_manifest  # noqa: E402
from trio_kubelet.config import AgentOptions, KubeletConfiguration  # noqa: E402
from trio_kubelet.runtime.client import CRIClient  # noqa: E402
from trio_kubelet.server.connections import HTTPLimits  # noqa: E402
from trio_kubelet.server.health import NodeHealth  # noqa: E402
from trio_kubelet.server.healthz_server import serve_healthz  # noqa: E402
from trio_kubelet.server.view import NodeView  # noqa: E402
from trio_kubelet.sources.static_files import (  # noqa: E402
    parse_manifest,
    read_manifest_file,
    run_static_files,
)
from trio_kubelet.status.store import PodStatusStore  # noqa: E402

POLLER = ROOT / "tests" / "healthz_poller.py"


def rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")
    return rss_kib()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1)]


def longest_gil_hold(work: Any) -> tuple[float, Any]:
    """``work()`` in a thread; the longest this thread waited past a 1 ms sleep (ms)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()))
    longest, last = 0.0, time.perf_counter()
    thread.start()
    while thread.is_alive():
        time.sleep(0.001)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    thread.join()
    return longest * 1000, result[0]


def shapes(directory: Path) -> dict[str, Any]:
    report = {}
    for name, (suffix, data) in sorted(HOSTILE.items()):
        path = directory / f"{name}{suffix}"
        path.write_bytes(data)
        base = reset_peak()
        began = time.perf_counter()
        gil_ms, result = longest_gil_hold(partial(read_manifest_file, path, "bench-node"))
        report[name] = {
            "bytes": len(data),
            "ms": round((time.perf_counter() - began) * 1000, 1),
            "peak_rss_growth_mib": round((rss_kib("VmHWM") - base) / 1024, 1),
            "longest_gil_hold_ms": round(gil_ms, 1),
            "refusal": result.problems[0].reason if result.problems else None,
        }
        path.unlink()
    return report


async def healthz_while_reading(directory: Path) -> dict[str, Any]:
    options = AgentOptions(config=KubeletConfiguration(), node_name="bench-node",
                           root_dir=directory)
    view = NodeView(options=options, store=PodStatusStore(), client=cast(CRIClient, object()),
                    last_relist=trio.current_time, last_sync_loop=trio.current_time)
    manifests = directory / "manifests"
    manifests.mkdir()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    send, receive = trio.open_memory_channel[Any](math.inf)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(partial(serve_healthz, NodeHealth(view), listeners,
                                              limits=HTTPLimits()))
        await nursery.start(partial(run_static_files, send, manifests, "bench-node",
                                    poll_interval=0.1))
        await trio.sleep(1)
        base = reset_peak()
        poller = await trio.lowlevel.open_process(
            [sys.executable, str(POLLER), str(port), "300"], stdout=subprocess.PIPE)
        await trio.sleep(1)
        began = time.perf_counter()
        for name, (suffix, data) in HOSTILE.items():
            (manifests / f".{name}").write_bytes(data)
            (manifests / f".{name}").rename(manifests / f"{name}{suffix}")
        while True:  # until one update reports every file
            update = await receive.receive()
            if len({p.file for p in update.problems}) == len(HOSTILE):
                break
        read_s = time.perf_counter() - began
        await trio.sleep(1)
        poller.send_signal(signal.SIGTERM)
        assert poller.stdout is not None
        output = b""
        while chunk := await poller.stdout.receive_some():
            output += chunk
        await poller.wait()
        nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()
    answers = json.loads(output)
    latencies = answers["latencies_ms"]
    return {
        "all_files_read_s": round(read_s, 2),
        "answers": len(latencies),
        "errors": answers["errors"],
        "p50_ms": round(percentile(latencies, 0.5), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
        "peak_rss_growth_mib": round((rss_kib("VmHWM") - base) / 1024, 1),
    }


def fuzz(count: int) -> dict[str, Any]:
    rng = random.Random(19)
    inputs = [bytes(rng.randrange(256) for _ in range(rng.randrange(49))) for _ in range(count)]
    began, cpu = time.perf_counter(), time.process_time()
    valid = 0
    for data in inputs:
        suffix, raw = build_manifest(data)
        valid += bool(parse_manifest(raw, f"/fuzz{suffix}", "bench-node", suffix=suffix).pods)
    return {"manifests": count, "valid": valid,
            "wall_s": round(time.perf_counter() - began, 2),
            "cpu_s": round(time.process_time() - cpu, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fuzz", type=int, default=10_000, help="fuzzed manifests to read")
    args = parser.parse_args()
    load_at_start = round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        report: dict[str, Any] = {"shapes": shapes(Path(tmp))}
        report["healthz"] = trio.run(healthz_while_reading, Path(tmp))
    report["fuzz"] = fuzz(args.fuzz)
    report["loadavg_1m_at_start"] = load_at_start
    report["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

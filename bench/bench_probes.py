"""Probe cost: agent CPU and probe jitter with 100 pods, each with a liveness and a readiness probe.

The goal (issue): 100 pods, each with a liveness and a readiness probe every 10 s: agent CPU at
most 10 % of a core on top of the steady-state figure, and probe execution jitter p99 at most
100 ms.

Two phases, each in a fresh Python process (a child of this script, so neither inherits the
other's heap, caches or collector state), each against its own runtime:

- ``baseline``: the same pods without probes (the steady-state figure for these pods);
- ``probes``: every pod's single container (busybox ``sleep 3600``) has an exec liveness probe
  and a readiness probe (exec by default; ``--readiness http|tcp`` probes a local HTTP server
  instead), ``periodSeconds`` 10.

In each phase the agent runs *in the phase's process* (``run_agent`` with Go kubelet flags and
the default configuration, its servers on a free 127.0.0.1 port, INFO logs to a file in klog
format, ``gc.freeze()`` before ``trio.run`` as the CLI does), so the bench can watch it. The
runtime is served by another process and not counted:

- ``--runtime fake`` (default): the in-memory fake runtime (``bench/fake_runtime_server.py``).
  Its ExecSync answers exit code 0 at once; on the agent's side an exec probe is exactly what it
  is against containerd (the probe worker's tick, one ExecSync round trip through the CRI client,
  the result bookkeeping), only the runtime's answer comes sooner, which is why exec is the
  default for both probes. ``--readiness http`` / ``tcp`` probe a ``python -m http.server`` on
  127.0.0.1 (a third process): the other common kind, whose agent-side cost (httpx, a new
  connection per probe) differs from exec's;
- ``--runtime containerd``: a private containerd (``scripts/containerd-env``, root), where exec
  probes really run ``runc exec``; use fewer pods there (e.g. ``--pods 20``) on a small machine.

Once every pod's container runs and every pod is Ready (the readiness probes have passed), and a
settle period has passed, the process's CPU time (``/proc/self/stat`` utime+stime, all threads:
the agent plus the bench's few wrappers, which only append timestamps) is read over the window
(60 s by default: the default ``syncFrequency``, so it holds one resync of every pod, as
``bench_steady_state.py``'s does). ``added_cpu_percent_of_core`` is probes minus baseline.

Jitter, without touching ``src/``: ``ProbeManager._tick`` (entered at the top of each worker
loop iteration, in the same step as the loop computes its next deadline, ``now + period``) and
``ProbeManager._run_probe`` (the call of ``Prober.probe``) are wrapped on the class. For every
probe that follows a timer tick, ``jitter = probe start - (previous tick + periodSeconds)``, in
trio's clock: the wake-up delay of the worker plus its work before the probe call (reading the
status, the state machine). Ticks that a new container instance triggered early are not timer
ticks and are counted apart. Only probes whose scheduled tick falls in the window count. The
agent's CRI observer also counts every CRI call in the window by method (the probes should add
ExecSync calls and nothing else) and times the ExecSync round trips.

Prints one JSON object. Usage:
``python bench/bench_probes.py [--runtime fake|containerd] [--pods 100] [--period 10]
[--window 60] [--readiness exec|http|tcp] [--phase both|baseline|probes]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from bench_steady_state import (
    containerd_unavailable,
    cpu_seconds,
    fake_runtime,
    private_containerd,
    rss_mib,
    sleep_pod_manifest,
    stop_process,
    tree_version,
)

from trio_kubelet.agent import run_agent
from trio_kubelet.cli import KlogFormatter, parse_run_options
from trio_kubelet.probes.manager import ProbeManager
from trio_kubelet.status.store import PodStatusStore

NODE = "bench"
IMAGE = "docker.io/library/busybox:1.36"
TARGET_ADDED_CPU_PERCENT = 10.0
TARGET_JITTER_P99_MS = 100.0
EARLY = 0.001  # a tick more than this before its deadline was triggered, not timed

LIVENESS = """\
    livenessProbe:
      exec: {{command: ["true"]}}
      periodSeconds: {period}
"""

READINESS = {
    "exec": """\
    readinessProbe:
      exec: {{command: ["ls", "/"]}}
      periodSeconds: {period}
""",
    "http": """\
    readinessProbe:
      httpGet: {{host: 127.0.0.1, port: {port}, path: /}}
      periodSeconds: {period}
""",
    "tcp": """\
    readinessProbe:
      tcpSocket: {{host: 127.0.0.1, port: {port}}}
      periodSeconds: {period}
""",
}


# --- what the wrappers record -----------------------------------------------------------------


@dataclass
class ProbeRun:
    kind: str  # liveness / readiness
    previous_tick: float | None  # the worker's previous loop top (trio clock)
    tick: float  # this loop top
    start: float  # Prober.probe called
    end: float
    period: float
    result: str | None  # None: the probe could not run (ProbeError)

    @property
    def scheduled(self) -> float | None:
        return None if self.previous_tick is None else self.previous_tick + self.period

    @property
    def timed(self) -> bool:
        """The tick came from the worker's timer, not from a trigger (a new container)."""
        return self.scheduled is not None and self.tick >= self.scheduled - EARLY


@dataclass
class Watch:
    ticks: dict[Any, float] = field(default_factory=dict)  # worker -> its current loop top
    previous: dict[Any, float] = field(default_factory=dict)  # worker -> its previous loop top
    runs: list[ProbeRun] = field(default_factory=list)
    exec_syncs: list[tuple[float, float]] = field(default_factory=list)  # end, duration
    calls: list[tuple[float, str]] = field(default_factory=list)  # end, method: every CRI call

    def observe(self, method: str, request: Any, outcome: Any, duration: float) -> None:
        self.calls.append((trio.current_time(), method))
        if method == "ExecSync":
            self.exec_syncs.append((trio.current_time(), duration))


def wrap_probe_manager(watch: Watch) -> None:
    """Timestamp each worker's loop top (``_tick``) and each probe call (``_run_probe``)."""
    original_tick = ProbeManager._tick
    original_run = ProbeManager._run_probe

    async def _tick(self: ProbeManager, worker: Any, state: Any, published: Any) -> Any:
        now = trio.current_time()  # the loop set next_tick = now + period in this same step
        if worker in watch.ticks:
            watch.previous[worker] = watch.ticks[worker]
        watch.ticks[worker] = now
        return await original_tick(self, worker, state, published)

    async def _run_probe(self: ProbeManager, worker: Any, pod: Any, container_id: str,
                         pod_ip: str | None) -> Any:
        start = trio.current_time()
        result = await original_run(self, worker, pod, container_id, pod_ip)
        watch.runs.append(ProbeRun(
            kind=worker.probe_type.value, previous_tick=watch.previous.get(worker),
            tick=watch.ticks[worker], start=start, end=trio.current_time(),
            period=float(worker.probe.period_seconds),
            result=None if result is None else result.value))
        return result

    ProbeManager._tick = _tick
    ProbeManager._run_probe = _run_probe


# --- helpers ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def http_server(workdir: Path) -> Iterator[int]:
    """``python -m http.server`` on 127.0.0.1 (its own process: its CPU is not the agent's)."""
    port = free_port()
    root = workdir / "www"
    root.mkdir()
    (root / "index.html").write_text("ok\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the local HTTP server did not start") from None
                time.sleep(0.05)
        yield port
    finally:
        stop_process(proc)


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | int | None]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p99": None, "max": None}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale, 2)

    return {"n": len(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99),
            "max": round(ordered[-1] * scale, 2)}


def write_manifests(directory: Path, pods: int, with_probes: bool, period: int,
                    readiness: str, http_port: int) -> None:
    directory.mkdir(parents=True)
    probes = ""
    if with_probes:
        probes = (LIVENESS.format(period=period)
                  + READINESS[readiness].format(period=period, port=http_port))
    for index in range(pods):
        name = f"probes-{index:03d}"
        (directory / f"{name}.yaml").write_text(
            sleep_pod_manifest(name, IMAGE, "probes", probes))


def running_and_ready(store: PodStatusStore, pods: int) -> tuple[int, int]:
    running = ready = 0
    for pod in store.pods():
        status = pod.status
        if any(s.state.running is not None for s in status.container_statuses):
            running += 1
            if any(c.type == "Ready" and c.status == "True" for c in status.conditions):
                ready += 1
    return running, ready


# --- one phase (a child process) --------------------------------------------------------------


async def run_phase(args: argparse.Namespace, endpoint: str, workdir: Path, http_port: int,
                    runtime_pid: int | None, watch: Watch) -> dict[str, Any]:
    with_probes = args.phase == "probes"
    manifests = workdir / "manifests"
    write_manifests(manifests, args.pods, with_probes, args.period, args.readiness, http_port)
    options = parse_run_options([
        "--pod-manifest-path", str(manifests), "--container-runtime-endpoint", endpoint,
        "--cgroups-per-qos=false",  # fake pods: no cgroups on the host
        "--root-dir", str(workdir / "root"), "--pod-logs-dir", str(workdir / "pod-logs"),
        "--hostname-override", NODE, "--node-ip", "127.0.0.1",
        "--address", "127.0.0.1", "--port", str(free_port()), "--healthz-port", "0",
    ])
    store = PodStatusStore()
    result: dict[str, Any] = {}
    me = os.getpid()
    async with trio.open_nursery() as nursery:
        started = trio.current_time()
        await nursery.start(lambda task_status: run_agent(
            options, store=store, cri_observer=watch.observe, task_status=task_status))
        all_running: float | None = None
        with trio.move_on_after(args.start_timeout) as waiting:
            while True:
                running, ready = running_and_ready(store, args.pods)
                if all_running is None and running >= args.pods:
                    all_running = trio.current_time() - started
                if ready >= args.pods:
                    break
                with trio.move_on_after(0.5):
                    await store.wait_changed()
        if waiting.cancelled_caught:
            raise RuntimeError(f"after {args.start_timeout}s: {running}/{args.pods} running, "
                               f"{ready} ready (agent log: {workdir / 'agent.log'})")
        result["all_running_after_s"] = round(all_running or 0.0, 1)
        result["all_ready_after_s"] = round(trio.current_time() - started, 1)
        await trio.sleep(args.settle)

        runtime_cpu0 = cpu_seconds(runtime_pid) if runtime_pid is not None else 0.0
        rss = [rss_mib(me)]
        cpu0, wall0, w0 = cpu_seconds(me), time.monotonic(), trio.current_time()
        deadline = w0 + args.window
        while (now := trio.current_time()) < deadline:
            await trio.sleep(min(1.0, deadline - now))
            rss.append(rss_mib(me))
        cpu1, wall1, w1 = cpu_seconds(me), time.monotonic(), trio.current_time()
        runtime_cpu1 = cpu_seconds(runtime_pid) if runtime_pid is not None else 0.0
        # Let the probes scheduled at the end of the window start before stopping the agent.
        await trio.sleep(min(2.0, args.period))
        nursery.cancel_scope.cancel()

    seconds = wall1 - wall0
    result.update({
        "cpu_percent_of_core": round(100 * (cpu1 - cpu0) / seconds, 2),
        "cpu_s": round(cpu1 - cpu0, 3),
        "rss_mib": round(rss[-1], 1),
        "rss_max_mib": round(max(rss), 1),
        "window_s": round(seconds, 1),
    })
    if runtime_pid is not None:
        result["fake_runtime_cpu_percent_of_core"] = round(
            100 * (runtime_cpu1 - runtime_cpu0) / seconds, 2)
    result["cri_calls_in_window"] = dict(
        Counter(method for end, method in watch.calls if w0 <= end < w1).most_common())
    if with_probes:
        result.update(summarize_probes(watch, w0, w1, args))
    return result


def summarize_probes(watch: Watch, w0: float, w1: float,
                     args: argparse.Namespace) -> dict[str, Any]:
    timed = [r for r in watch.runs
             if r.timed and r.scheduled is not None and w0 <= r.scheduled < w1]
    triggered = [r for r in watch.runs if not r.timed and w0 <= r.tick < w1]
    jitter = [abs(r.start - r.scheduled) for r in timed if r.scheduled is not None]
    wake = [r.tick - r.scheduled for r in timed if r.scheduled is not None]
    before = [r.start - r.tick for r in timed]
    started_in_window = [r for r in watch.runs if w0 <= r.start < w1]
    execs = [d for end, d in watch.exec_syncs if w0 <= end < w1]
    by_kind = {kind: percentiles([abs(r.start - r.scheduled) for r in timed
                                  if r.kind == kind and r.scheduled is not None])
               for kind in ("liveness", "readiness")}
    late = sorted(timed, key=lambda r: r.start - (r.scheduled or 0.0), reverse=True)[:5]
    return {
        "probes_started_in_window": len(started_in_window),
        "probes_expected_in_window": round(2 * args.pods * (w1 - w0) / args.period),
        "probe_results_in_window": dict(Counter(str(r.result) for r in started_in_window)),
        "jitter_ms": percentiles(jitter),
        "jitter_by_probe_ms": by_kind,
        "jitter_over_100ms": sum(1 for j in jitter if j > 0.1),
        # The two parts of the jitter: the worker waking after its deadline, and its work
        # between waking and calling the prober.
        "wake_delay_ms": percentiles(wake),
        "tick_to_probe_call_ms": percentiles(before),
        "triggered_probes_in_window": len(triggered),
        "probe_duration_ms": percentiles([r.end - r.start for r in started_in_window]),
        "exec_sync_calls_in_window": len(execs),
        "exec_sync_round_trip_ms": percentiles(execs),
        # The loop computes its next deadline from when it woke, so each period lasts
        # period + wake delay; this is the mean of that excess (drift per period).
        "period_overrun_mean_ms": round(1000 * sum(wake) / len(wake), 2) if wake else None,
        "latest_probes": [
            {"at_s": round((r.scheduled or 0.0) - w0, 2),
             "jitter_ms": round(1000 * (r.start - (r.scheduled or 0.0)), 1), "probe": r.kind}
            for r in late],
    }


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Run one phase in this process and return its figures."""
    workdir = Path(tempfile.mkdtemp(prefix=f"tkb-probes-{args.phase}-", dir="/tmp"))
    agent_log = workdir / "agent.log"
    handler = logging.FileHandler(agent_log)
    handler.setFormatter(KlogFormatter())
    agent_logger = logging.getLogger("trio_kubelet")
    agent_logger.setLevel(logging.INFO)
    agent_logger.addHandler(handler)
    agent_logger.propagate = False
    for chatty in ("httpx", "httpcore"):  # as the CLI at its default verbosity
        logging.getLogger(chatty).setLevel(logging.WARNING)
    watch = Watch()
    wrap_probe_manager(watch)
    result: dict[str, Any] = {}
    try:
        serve_http = args.readiness != "exec" and args.phase == "probes"
        with http_server(workdir) if serve_http else _no_server() as http_port:
            runtime_cm = (fake_runtime(workdir) if args.runtime == "fake"
                          else private_containerd())
            with runtime_cm as (endpoint, runtime_proc):
                gc.collect()
                gc.freeze()  # as the CLI does before trio.run
                result = trio.run(run_phase, args, endpoint, workdir, http_port,
                                  runtime_proc.pid if runtime_proc is not None else None, watch)
    finally:
        handler.close()
        text = agent_log.read_text(errors="replace") if agent_log.exists() else ""
        lines = [line for line in text.splitlines() if line[:1] in ("W", "E")]
        result["agent_log_warnings"] = len(lines)
        if lines:
            result["agent_log_first_warnings"] = lines[:3]
        if args.keep:
            result["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


@contextmanager
def _no_server() -> Iterator[int]:
    yield 0


# --- the parent: both phases ------------------------------------------------------------------


def run_child(phase: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = ["--runtime", args.runtime, "--pods", str(args.pods), "--period", str(args.period),
            "--readiness", args.readiness, "--window", str(args.window),
            "--settle", str(args.settle), "--start-timeout", str(args.start_timeout),
            "--phase", phase, "--child", *(["--keep"] if args.keep else [])]
    done = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": f"phase {phase} exited {done.returncode}: {done.stderr[-3000:]}"}
    phase_result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return phase_result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=("fake", "containerd"), default="fake")
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--period", type=int, default=10, help="periodSeconds of both probes")
    parser.add_argument("--readiness", choices=("exec", "http", "tcp"), default="exec",
                        help="readiness probe kind (liveness is always exec)")
    parser.add_argument("--window", type=float, default=60.0, help="sampling window (s)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="wait after every pod is running and ready, before sampling (s)")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--phase", choices=("both", "baseline", "probes"), default="both")
    parser.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(child(args)))
        return
    result: dict[str, Any] = {
        "bench": "probes", "runtime": args.runtime, "pods": args.pods,
        "period_s": args.period, "liveness": "exec", "readiness": args.readiness,
    }
    if args.runtime == "containerd":
        skip = containerd_unavailable()
        if skip is not None:
            print(json.dumps({**result, "skipped": skip}))
            return
    load_at_start = round(os.getloadavg()[0], 2)
    phases = ("baseline", "probes") if args.phase == "both" else (args.phase,)
    for phase in phases:
        result[phase] = run_child(phase, args)
    base, probes = result.get("baseline", {}), result.get("probes", {})
    if "cpu_percent_of_core" in base and "cpu_percent_of_core" in probes:
        added = probes["cpu_percent_of_core"] - base["cpu_percent_of_core"]
        started = probes.get("probes_started_in_window") or 0
        result["added_cpu_percent_of_core"] = round(added, 2)
        if started:
            result["added_cpu_ms_per_probe"] = round(
                1000 * (probes["cpu_s"] - base["cpu_s"] * probes["window_s"] / base["window_s"])
                / started, 3)
    if "jitter_ms" in probes:
        result["jitter_p50_ms"] = probes["jitter_ms"]["p50"]
        result["jitter_p99_ms"] = probes["jitter_ms"]["p99"]
        result["jitter_max_ms"] = probes["jitter_ms"]["max"]
    result["target"] = {"added_cpu_percent_of_core": TARGET_ADDED_CPU_PERCENT,
                        "jitter_p99_ms": TARGET_JITTER_P99_MS}
    if "added_cpu_percent_of_core" in result and result.get("jitter_p99_ms") is not None:
        result["targets_met"] = (
            result["added_cpu_percent_of_core"] <= TARGET_ADDED_CPU_PERCENT
            and result["jitter_p99_ms"] <= TARGET_JITTER_P99_MS)
    result["method"] = (
        "each phase in a fresh process running the agent in-process (run_agent) against a "
        "runtime in another process; CPU = that process's utime+stime over the window after all "
        "pods ran and were Ready; jitter = |Prober.probe call - (previous worker tick + "
        "periodSeconds)| over timer ticks scheduled in the window (ProbeManager._tick and "
        "_run_probe wrapped on the class)")
    result["tree"] = tree_version()
    result["loadavg_1m_at_start"] = load_at_start
    result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    result["python"] = platform.python_version()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

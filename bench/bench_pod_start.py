"""Agent overhead on pod start against a real containerd: manifest delivered → container Running.

Starts a private containerd (``scripts/containerd-env start`` under /tmp), runs the agent in this
process with a manifest directory, and creates single-container pods (busybox ``sleep 3600``) one
at a time. For each pod it takes

- ``t0``: the start of the static source's rescan that first delivered the pod. The source polls
  the directory once a second; the wait for that poll tick is the configured polling delay, not
  agent work, so it is left out. Everything after it is counted: reading and validating the
  manifests, the channel, the sync loop, the pod worker.
- ``t1``: the moment the pod worker publishes a status with the container running (a wrapped
  ``PodStatusStore.set``, so no reader's scheduling delay is added).
- ``cri``: the summed durations, as the agent's CRI observer reports them, of the calls the pod's
  worker made in ``[t0, t1]`` (attributed by pod UID, sandbox and container ids; the PLEG's
  unfiltered relists run concurrently and are not on the pod's path, so they are not subtracted).
  Pods are started sequentially and the bench waits for the previous pod's follow-up sync to end.
- ``overhead`` = ``t1 - t0 - cri``.

The observer's duration includes the client side of each call (trio → asyncio hop, grpclib
encoding/decoding, HTTP/2) as well as containerd's own time. For RunPodSandbox, CreateContainer
and StartContainer containerd logs when it started and finished handling the call, so the bench
also reports the client-side part of those calls and ``overhead_strict`` = wall minus
(containerd-logged time of those three + observer time of the read calls): the agent's share
with the client's gRPC costs moved to the agent's side.

Prints one JSON object (p50/p99 in ms). ``--profile`` samples the agent inside the [t0, t1]
windows with pyinstrument (or cProfile when it is not installed) and adds the top self-time
functions; profiled runs are slower, so compare their numbers with unprofiled ones only.

Needs root and containerd (``scripts/containerd-env install``).
Usage: ``python bench/bench_pod_start.py [--pods 50] [--profile] [--profile-out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import trio
from bench_steady_state import tree_version

from trio_kubelet.agent import run_agent
from trio_kubelet.cli import KlogFormatter, parse_run_options
from trio_kubelet.model.pod import Pod, PodStatus
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.sources import static_files
from trio_kubelet.status.store import PodStatusStore

ROOT = Path(__file__).resolve().parents[1]
CONTAINERD_ENV = ROOT / "scripts" / "containerd-env"
NODE = "bench"
IMAGE = "docker.io/library/busybox:1.36"
CONTAINER = "sleep"
PLEG_PERIOD = 1.0  # trio_kubelet.sources.pleg.RELIST_PERIOD
TARGET_P50_MS, TARGET_P99_MS = 50.0, 150.0
POD_TIMEOUT = 60.0

MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: bench}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: {container}
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"""


# --- a private containerd ---------------------------------------------------------------------


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (containerd, runc, network namespaces)"
    missing = [tool for tool in ("containerd", "ctr", "runc") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed: run `scripts/containerd-env install`"
    return None


def _containerd_env(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CONTAINERD_ENV), *args], capture_output=True, text=True,
                          timeout=300)


@contextmanager
def private_containerd() -> Iterator[Path]:
    """Start containerd under a fresh /tmp directory (socket paths must be < 108 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="tkb-ctrd-", dir="/tmp"))
    done = _containerd_env("start", str(root))
    if done.returncode != 0:
        _containerd_env("stop", str(root))
        sys.exit(f"containerd-env start failed:\n{done.stderr}")
    try:
        yield root
    finally:
        done = _containerd_env("stop", str(root))
        if done.returncode == 0:
            shutil.rmtree(root, ignore_errors=True)
        else:
            sys.stderr.write(f"containerd-env stop failed, kept {root}:\n{done.stderr}\n")


# --- containerd's own timing of the mutating calls (from its info-level log) ------------------

_LOG_LINE = re.compile(r'^time="([^"]+)" level=\w+ msg="(.*)"\s*$')
_RUN_SANDBOX = re.compile(r"^RunPodSandbox for &PodSandboxMetadata\{.*?Uid:([0-9a-z-]+),")
_SANDBOX_ID = re.compile(r'returns sandbox id \\"([0-9a-f]+)\\"$')
_CREATE = re.compile(r'^CreateContainer within sandbox \\"([0-9a-f]+)\\" for (?:container )?'
                     r"&ContainerMetadata\{Name:([^,]+),Attempt:(\d+)")
_CONTAINER_ID = re.compile(r'returns container id \\"([0-9a-f]+)\\"$')
_START = re.compile(r'^StartContainer for \\"([0-9a-f]+)\\"( returns successfully)?$')


def _epoch(stamp: str) -> float:
    """containerd's RFC 3339 nanosecond timestamps (fromisoformat takes microseconds)."""
    match = re.match(r"^(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", stamp)
    if match is None:
        raise ValueError(stamp)
    base, frac, zone = match.groups()
    moment = datetime.fromisoformat(base + ("+00:00" if zone == "Z" else zone))
    return moment.timestamp() + (int(frac) / 10 ** len(frac) if frac else 0.0)


def containerd_server_times(log: Path) -> dict[tuple[str, str], float]:
    """{(method, key): seconds} from containerd's log, keyed by what the observer can see:
    RunPodSandbox by pod UID, CreateContainer by the container id it returned, StartContainer
    by container id."""
    started: dict[tuple[str, str], float] = {}
    times: dict[tuple[str, str], float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = _LOG_LINE.match(line)
        if match is None:
            continue
        stamp, msg = match.groups()
        if msg.startswith("RunPodSandbox for"):
            run = _RUN_SANDBOX.match(msg)
            if run is None:
                continue
            key = ("RunPodSandbox", run.group(1))
            if _SANDBOX_ID.search(msg):
                if key in started:
                    times[key] = _epoch(stamp) - started.pop(key)
            else:
                started[key] = _epoch(stamp)
        elif msg.startswith("CreateContainer within sandbox"):
            create = _CREATE.match(msg)
            if create is None:
                continue
            key = ("CreateContainer", "/".join(create.groups()))
            returned = _CONTAINER_ID.search(msg)
            if returned is None:
                started[key] = _epoch(stamp)
            elif key in started:
                times[("CreateContainer", returned.group(1))] = _epoch(stamp) - started.pop(key)
        elif msg.startswith("StartContainer for"):
            start = _START.match(msg)
            if start is None:
                continue
            key = ("StartContainer", start.group(1))
            if start.group(2):
                if key in started:
                    times[key] = _epoch(stamp) - started.pop(key)
            else:
                started[key] = _epoch(stamp)
    return times


# --- watching the agent from inside -----------------------------------------------------------


@dataclass
class Call:
    """One CRI call as the observer saw it (attribution happens after the run)."""

    end: float  # perf_counter
    method: str
    request: Any
    outcome: Any
    duration: float
    uid: str | None = None  # filled by attribute()
    pleg: bool = False

    @property
    def start(self) -> float:
        return self.end - self.duration


@dataclass
class Probe:
    """What the wrapped source, store, observer and log handler recorded (perf_counter times)."""

    calls: list[Call] = field(default_factory=list)
    scans: list[tuple[float, float, object]] = field(default_factory=list)  # start, end, update
    scan_cpu: list[float] = field(default_factory=list)  # process CPU time at each scan start
    added: dict[str, float] = field(default_factory=dict)  # uid -> "Added pod" logged
    running: dict[str, float] = field(default_factory=dict)  # uid -> running status published
    running_cpu: dict[str, float] = field(default_factory=dict)  # uid -> process CPU time then
    watched: set[str] = field(default_factory=set)
    profiler: Any = None
    profiling: bool = False

    def observe(self, method: str, request: Any, outcome: Any, duration: float) -> None:
        self.calls.append(Call(time.perf_counter(), method, request, outcome, duration))

    def start_profile(self) -> None:
        if self.profiler is not None and not self.profiling:
            self.profiling = True
            self.profiler.start() if hasattr(self.profiler, "start") else self.profiler.enable()

    def stop_profile(self) -> None:
        if self.profiler is not None and self.profiling:
            self.profiling = False
            self.profiler.stop() if hasattr(self.profiler, "stop") else self.profiler.disable()


class WatchedStore(PodStatusStore):
    """Records when each watched pod's container is first published as running."""

    def __init__(self, probe: Probe) -> None:
        super().__init__()
        self._probe = probe

    def set(self, pod: Pod, status: PodStatus, *, stopped: bool = False) -> None:
        super().set(pod, status, stopped=stopped)
        uid = pod.metadata.uid
        probe = self._probe
        if uid in probe.watched and uid not in probe.running and any(
            s.name == CONTAINER and s.state.running is not None for s in status.container_statuses
        ):
            probe.running[uid] = time.perf_counter()
            probe.running_cpu[uid] = time.process_time()
            probe.stop_profile()


class AddedPodHandler(logging.Handler):
    """Timestamps the "Added pod NAME (UID) from source file" line, per UID (matched on the
    message, so it survives the line moving between modules)."""

    _ADDED = re.compile(r"^Added pod \S+ \(([0-9a-f-]+)\) from source file")

    def __init__(self, probe: Probe) -> None:
        super().__init__(logging.INFO)
        self._probe = probe

    def emit(self, record: logging.LogRecord) -> None:
        if record.args and record.args[0] == "Added":
            match = self._ADDED.match(record.getMessage())
            if match is not None:
                self._probe.added.setdefault(match.group(1), time.perf_counter())


def wrap_static_source(probe: Probe) -> None:
    """Time every rescan of the manifest directory (the source's own work starts there)."""
    original = static_files._StaticPodFiles.rescan

    async def rescan(self: static_files._StaticPodFiles) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        probe.start_profile()
        update = await original(self)
        probe.scans.append((start, time.perf_counter(), update))
        probe.scan_cpu.append(cpu)
        pending = probe.watched - probe.running.keys()
        if update is None or not any(pod.metadata.uid in pending for pod in update.pods):
            probe.stop_profile()  # a rescan that delivered no new pod: not a measured window
        return update

    static_files._StaticPodFiles.rescan = rescan  # type: ignore[method-assign]


def attribute(calls: list[Call]) -> None:
    """Give each call the pod UID it concerns, following ids through the answers."""
    owner: dict[str, str] = {}
    for call in calls:
        request, outcome, method = call.request, call.outcome, call.method
        uid: str | None = None
        if method in ("ListPodSandbox", "ListContainers"):
            selector = request.filter.label_selector if request.filter is not None else {}
            uid = selector.get(labels.POD_UID)
            call.pleg = uid is None
            items = getattr(outcome, "items", None) or getattr(outcome, "containers", None)
            for item in items or ():
                item_uid = item.labels.get(labels.POD_UID)
                if item_uid:
                    owner[item.id] = item_uid
        elif method == "RunPodSandbox":
            uid = request.config.metadata.uid
            if getattr(outcome, "pod_sandbox_id", ""):
                owner[outcome.pod_sandbox_id] = uid
        elif method == "CreateContainer":
            uid = request.sandbox_config.metadata.uid
            if getattr(outcome, "container_id", ""):
                owner[outcome.container_id] = uid
        elif hasattr(request, "container_id"):
            uid = owner.get(request.container_id)
        elif hasattr(request, "pod_sandbox_id"):
            uid = owner.get(request.pod_sandbox_id)
        call.uid = uid


# --- the run ----------------------------------------------------------------------------------


@dataclass
class PodSample:
    uid: str
    wall_ms: float
    cri_ms: float
    source_ms: float  # t0 -> sync loop "Added pod"
    files: int  # manifest files in the directory when the pod was delivered
    agent_cpu_ms: float  # CPU of the agent's process (trio + the CRI asyncio thread) in [t0, t1]
    calls: int
    cri_client_ms: float | None  # observer minus containerd-logged time, 3 mutating calls
    cri_server_known_ms: float | None
    cri_observed_known_ms: float | None

    @property
    def overhead_ms(self) -> float:
        return self.wall_ms - self.cri_ms


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _wait_quiet(probe: Probe, uid: str, t1: float, quiet: float = 0.15,
                      limit: float = 5.0) -> None:
    """After a pod started: wait for the PLEG relist that sees it and the follow-up sync of the
    pod it triggers, so the next pod's window holds no other pod's work."""
    deadline = time.perf_counter() + limit
    while time.perf_counter() < deadline:
        await trio.sleep(0.02)
        relisted = any(c.method == "ListContainers" and c.start > t1 and _is_pleg(c)
                       for c in reversed(probe.calls[-50:]))
        last = max((c.end for c in probe.calls[-50:] if not _is_pleg(c)), default=0.0)
        if relisted and time.perf_counter() - last >= quiet:
            return


def _is_pleg(call: Call) -> bool:
    if call.method not in ("ListPodSandbox", "ListContainers"):
        return False
    return call.request.filter is None or labels.POD_UID not in call.request.filter.label_selector


async def _wait_for(predicate: Any, store: PodStatusStore, timeout: float, what: str) -> None:
    """Wait until ``predicate()`` holds, re-checking on every status change (and 4x a second,
    for conditions the store does not announce)."""
    with trio.move_on_after(timeout):
        while not predicate():
            with trio.move_on_after(0.25):
                await store.wait_changed()
        return
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


async def run_bench(pods: int, warmup: int, workdir: Path, endpoint: str, probe: Probe,
                    agent_log: Path, record: bool = False
                    ) -> tuple[list[PodSample], dict[str, Any]]:
    manifests = workdir / "manifests"
    manifests.mkdir()
    config = workdir / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        f"podLogsDir: {workdir / 'pod-logs'}\n"
    )
    options = parse_run_options([
        "--config", str(config), "--pod-manifest-path", str(manifests),
        "--container-runtime-endpoint", endpoint, "--root-dir", str(workdir / "root"),
        "--hostname-override", NODE, "--node-ip", "127.0.0.1",
        *(["--record", str(workdir / "recording.jsonl")] if record else []),
    ])
    # The agent logs at INFO as under the CLI (klog lines), to a file instead of stderr.
    handler = logging.FileHandler(agent_log)
    handler.setFormatter(KlogFormatter())
    agent_logger = logging.getLogger("trio_kubelet")
    agent_logger.setLevel(logging.INFO)
    agent_logger.addHandler(handler)
    agent_logger.addHandler(AddedPodHandler(probe))
    agent_logger.propagate = False
    wrap_static_source(probe)
    store = WatchedStore(probe)

    samples: list[PodSample] = []
    teardown_s = 0.0
    async with trio.open_nursery() as nursery:
        loop: SyncLoop = await nursery.start(
            lambda task_status: run_agent(options, store=store, cri_observer=probe.observe,
                                          task_status=task_status))
        await trio.sleep(1.5)  # connect, first relist, first scan of the empty directory
        for index in range(warmup + pods):
            name = f"bench-{index:03d}"
            path = manifests / f"{name}.yaml"
            uid = static_files.static_pod_uid(NODE, str(path.absolute()), "default", name)
            probe.watched.add(uid)
            tmp = manifests / f".{name}.tmp"
            tmp.write_text(MANIFEST.format(name=name, container=CONTAINER, image=IMAGE))
            written = time.perf_counter()
            tmp.rename(path)
            await _wait_for(lambda uid=uid: uid in probe.running, store, POD_TIMEOUT,
                            f"pod {name} to run")
            t1 = probe.running[uid]
            t0, cpu0 = next((start, cpu) for (start, _, update), cpu in
                            zip(probe.scans, probe.scan_cpu, strict=True)
                            if start >= written and update is not None
                            and any(p.metadata.uid == uid for p in update.pods))
            await _wait_quiet(probe, uid, t1)
            if index < warmup:
                continue
            attribute(probe.calls)
            mine = [c for c in probe.calls if t0 <= c.start and c.end <= t1 and not c.pleg
                    and c.uid in (uid, None)]
            added = probe.added.get(uid)
            samples.append(PodSample(
                uid=uid, wall_ms=(t1 - t0) * 1000, cri_ms=sum(c.duration for c in mine) * 1000,
                source_ms=(added - t0) * 1000 if added is not None else math.nan,
                files=index + 1, calls=len(mine),
                agent_cpu_ms=(probe.running_cpu[uid] - cpu0) * 1000,
                cri_client_ms=None, cri_server_known_ms=None, cri_observed_known_ms=None))
        # Tear down: delete every manifest and wait until the agent has removed the pods.
        start = time.perf_counter()
        for path in manifests.glob("*.yaml"):
            path.unlink()
        await _wait_for(lambda: not store.pods() and not loop.workers, store, 120.0,
                        "the pods to be torn down")
        teardown_s = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    handler.close()
    return samples, {"teardown_s": round(teardown_s, 2),
                     "cri_floor_ms_per_call": round(await cri_floor(endpoint) * 1000, 3)}


async def cri_floor(endpoint: str, calls: int = 200) -> float:
    """Median round trip of Version through the agent's CRI client: what any call costs on
    the client side (trio -> asyncio hop, grpclib, HTTP/2) plus containerd's trivial answer."""
    samples = []
    async with open_cri_client(endpoint) as client:
        for _ in range(calls):
            start = time.perf_counter()
            await client.version()
            samples.append(time.perf_counter() - start)
    return percentile(samples, 0.5)


def add_server_times(samples: list[PodSample], probe: Probe, containerd_log: Path) -> None:
    """Split the three mutating calls of each pod into containerd's time and the client's."""
    server = containerd_server_times(containerd_log)
    by_uid = {s.uid: s for s in samples}
    known: dict[str, list[tuple[float, float]]] = {}
    for call in probe.calls:
        if call.uid not in by_uid or call.method not in ("RunPodSandbox", "CreateContainer",
                                                         "StartContainer"):
            continue
        if call.method == "RunPodSandbox":
            key = call.uid
        elif call.method == "CreateContainer":
            key = getattr(call.outcome, "container_id", "")
        else:
            key = call.request.container_id
        seconds = server.get((call.method, key))
        if seconds is not None:
            known.setdefault(call.uid, []).append((call.duration, seconds))
    for uid, pairs in known.items():
        sample = by_uid[uid]
        if len(pairs) == 3:
            sample.cri_observed_known_ms = sum(o for o, _ in pairs) * 1000
            sample.cri_server_known_ms = sum(s for _, s in pairs) * 1000
            sample.cri_client_ms = sample.cri_observed_known_ms - sample.cri_server_known_ms


def profile_summary(profiler: Any, out: Path | None, top: int = 15) -> dict[str, Any]:
    """Where the agent's time went inside the [t0, t1] windows: self time by library, the
    top self-time functions, and inclusive time of the agent's own functions (idle = trio
    waiting in epoll for containerd's answers)."""
    self_time: dict[str, float] = {}
    inclusive: dict[str, float] = {}
    if hasattr(profiler, "last_session"):  # pyinstrument
        session = profiler.last_session
        if session is None:
            return {}
        if out is not None:
            out.write_text(profiler.output_text(unicode=False, color=False, show_all=True))

        def walk(frame: Any, parent: str, idle: bool, seen: frozenset[str]) -> None:
            if frame.is_synthetic:  # "[self]" and friends: time spent in the parent itself
                key = parent
            else:
                key = f"{frame.file_path}:{frame.function}"
                idle = idle or frame.function == "get_events"  # trio waiting in epoll
                if not idle and "trio_kubelet/" in frame.file_path and key not in seen:
                    inclusive[key] = inclusive.get(key, 0.0) + frame.time
                    seen = seen | {key}
            own = frame.time - sum(child.time for child in frame.children)
            if own > 0:
                name = "[idle]" if idle else key
                self_time[name] = self_time.get(name, 0.0) + own
            for child in frame.children:
                walk(child, key, idle, seen)

        root = session.root_frame()
        if root is not None:
            walk(root, "", False, frozenset())
        tool = "pyinstrument"
    else:  # cProfile: self time only
        import pstats

        stats = pstats.Stats(profiler)
        if out is not None:
            stats.dump_stats(str(out))
        for (file, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
            key = "[idle]" if "select.epoll" in function else f"{file}:{function}"
            self_time[key] = self_time.get(key, 0.0) + row[2]
        tool = "cProfile"
    idle = self_time.pop("[idle]", 0.0)
    busy = sum(self_time.values())
    by_library: dict[str, float] = {}
    for key, seconds in self_time.items():
        library = _library(key)
        by_library[library] = by_library.get(library, 0.0) + seconds

    def ranked(table: dict[str, float], n: int) -> list[dict[str, Any]]:
        rows = sorted(table.items(), key=lambda kv: kv[1], reverse=True)[:n]
        return [{"where": _short(k), "s": round(t, 4), "pct_of_busy": round(100 * t / busy, 1)}
                for k, t in rows]

    return {
        "tool": tool,
        "busy_s": round(busy, 3),
        "idle_wait_s": round(idle, 3),
        "self_time_by_library": ranked(by_library, 12),
        "top_self_time": ranked(self_time, top),
        "top_inclusive_agent_functions": ranked(inclusive, top),
    }


def _library(key: str) -> str:
    if "trio_kubelet/runtime/cri/" in key:
        return "trio_kubelet (generated CRI stubs)"
    if "trio_kubelet/" in key:
        return "trio_kubelet"
    if "bench_pod_start" in key:
        return "bench probes"
    if "site-packages/" in key:
        return key.split("site-packages/", 1)[1].split("/", 1)[0].split(".", 1)[0]
    if key.startswith("<built-in>") or key.startswith("~"):
        return "builtins"
    if "lib/python3" in key:
        return "stdlib:" + key.split("lib/python3", 1)[1].split("/", 2)[1].split(".py", 1)[0]
    return key


def _short(key: str) -> str:
    for marker in ("site-packages/", "/src/", "lib/python3.11/"):
        if marker in key:
            return key.split(marker, 1)[1]
    return key


def summarize(samples: list[PodSample], floor_ms: float) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p99": None, "max": None}
        return {"p50": round(percentile(values, 0.5), 1),
                "p99": round(percentile(values, 0.99), 1), "max": round(max(values), 1)}

    result: dict[str, Any] = {
        "wall_ms": stats([s.wall_ms for s in samples]),
        "cri_ms": stats([s.cri_ms for s in samples]),
        "overhead_ms": stats([s.overhead_ms for s in samples]),
        # Insensitive to other load on the machine: what the agent's threads themselves burnt.
        "agent_cpu_ms": stats([s.agent_cpu_ms for s in samples]),
        "breakdown_ms": {
            "source_to_sync_loop": stats([s.source_ms for s in samples
                                          if not math.isnan(s.source_ms)]),
            "worker_non_cri": stats([s.overhead_ms - s.source_ms for s in samples
                                     if not math.isnan(s.source_ms)]),
            "cri_calls_per_pod": stats([float(s.calls) for s in samples]),
        },
    }
    timed = [s for s in samples if not math.isnan(s.source_ms)]
    if len(timed) > 1:  # the source re-reads every manifest on each change: cost per file
        mean_f = sum(s.files for s in timed) / len(timed)
        mean_ms = sum(s.source_ms for s in timed) / len(timed)
        var = sum((s.files - mean_f) ** 2 for s in timed)
        slope = sum((s.files - mean_f) * (s.source_ms - mean_ms) for s in timed) / var
        result["breakdown_ms"]["source_ms_per_manifest_file"] = round(slope, 3)
    known = [s for s in samples if s.cri_client_ms is not None]
    if known:
        result["breakdown_ms"]["cri_client_side_3_mutating_calls"] = stats(
            [s.cri_client_ms for s in known if s.cri_client_ms is not None])
        # The read calls are not in containerd's info log: charge each the Version floor.
        result["overhead_strict_ms"] = stats(
            [s.overhead_ms + (s.cri_client_ms or 0.0) + floor_ms * (s.calls - 3)
             for s in known])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50, help="measured pods (started one by one)")
    parser.add_argument("--warmup", type=int, default=1, help="pods started first, not measured")
    parser.add_argument("--profile", action="store_true",
                        help="sample the agent inside the [t0, t1] windows (slows it down)")
    parser.add_argument("--profile-out", type=Path, help="write the full profile here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--record", action="store_true",
                        help="run the agent with --record (to measure the recorder's overhead)")
    args = parser.parse_args()

    skip = unavailable_reason()
    if skip is not None:  # not a failure: `nox -s bench` goes on with the other benches
        print(json.dumps({"bench": "pod_start", "skipped": skip}))
        return
    load_at_start = round(os.getloadavg()[0], 2)  # other work on the machine skews latencies
    probe = Probe()
    if args.profile:
        try:
            from pyinstrument import Profiler

            probe.profiler = Profiler(interval=0.0005, async_mode="disabled")
        except ImportError:
            import cProfile

            probe.profiler = cProfile.Profile()
    workdir = Path(tempfile.mkdtemp(prefix="tkb-podstart-", dir="/tmp"))
    with private_containerd() as ctrd:
        samples, extra = trio.run(run_bench, args.pods, args.warmup, workdir,
                                  f"unix://{ctrd / 'containerd.sock'}", probe,
                                  workdir / "agent.log", args.record)
        add_server_times(samples, probe, ctrd / "containerd.log")
    result: dict[str, Any] = {
        "bench": "pod_start",
        "runtime": "containerd " + _containerd_version(),
        "pods": len(samples),
        "warmup_pods": args.warmup,
        **summarize(samples, extra["cri_floor_ms_per_call"]),
        "target": {"overhead_p50_ms": TARGET_P50_MS, "overhead_p99_ms": TARGET_P99_MS},
        **extra,
        "profiled": args.profile,
        "recording": args.record,
        "method": ("t0 = start of the static source rescan that delivered the pod (its 1 s "
                   "polling wait excluded); t1 = running status published; cri = observer "
                   "durations of the pod's own calls in [t0,t1]; overhead = t1-t0-cri; "
                   "overhead_strict also charges the agent with the client side of the CRI calls: "
                   "observer minus containerd's logged time for RunPodSandbox/CreateContainer/"
                   "StartContainer, and cri_floor_ms_per_call (Version round trip) for each "
                   "read call"),
        "tree": tree_version(),
        "loadavg_1m_at_start": load_at_start,
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    if args.profile:
        result["profile"] = profile_summary(probe.profiler, args.profile_out)
    if args.keep:
        result["workdir"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result))


def _containerd_version() -> str:
    try:
        out = subprocess.run(["containerd", "--version"], capture_output=True, text=True,
                             timeout=10).stdout.split()
    except OSError:
        return "?"
    return out[2] if len(out) > 2 else "?"


if __name__ == "__main__":
    main()

"""Hollow nodes at scale against a real control plane (issue 23): one `trio-kubelet hollow` process.

Starts (or reuses) a control plane (``scripts/control-plane``: etcd, kube-apiserver,
kube-scheduler, kube-controller-manager with every controller), then ``trio-kubelet hollow
--nodes N`` as a process with the admin credentials, and measures, from outside as a user would:

* nodes Ready: seconds from the process's start until every node is Ready (and the p50/p99 of
  the nodes' own times), from a watch on Nodes;
* lease renewals: from a watch on the Leases, the gap between consecutive renewTimes of each
  hollow node's Lease, during start-up (until 15 s after every node is Ready), idle, while
  the pods start and at rest with them; a renewal is late when its gap exceeds 1.25 times the
  renew interval (10 s of the 40 s lease: the Go kubelet renews every 10 to 10.4 s);
* idle cost: the process's CPU (utime+stime from /proc) over ``--idle`` seconds once every node
  is Ready, as % of one core per node, and its RSS per node;
* API requests per node per minute, from the runner's own summary lines (every 60 s);
* pods: ``--pods`` bare pods (pause image, no nodeName: kube-scheduler binds them) created at
  ``--rate`` pods/s; startup latency = first seen Running and ready on a pod watch minus the
  moment its create request returned (the SLO's span: p99 ≤ 5 s), p50/p99/max and how many
  took over 5 s; the scheduler's share (create → first seen bound to a node) and the node's
  (bound → Running and ready); how fast pods were bound and went Running (per second, over
  the wave); the CPU of the hollow process and of each control-plane process (etcd,
  kube-apiserver, kube-scheduler, kube-controller-manager) while they start, as % of a core,
  and the hollow process's RSS at density; then, with every pod running, its CPU at rest
  over ``--rest`` seconds (the pods' resyncs and status rounds); then every pod is deleted;
* exit: seconds from SIGTERM to the process's exit, and whether every hollow Node is gone.

The machine's load average is reported at start and end (the control plane shares it).
Usage: ``python bench/bench_hollow.py [--nodes 50] [--pods 0] [--rate 20] [--idle 120]
[--control-plane DIR]``. Needs the control-plane binaries (docs/cluster.md); no root, no
containerd, no cgroups.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
PREFIX = "hollow-"
NAMESPACE = "default"
IMAGE = "registry.k8s.io/pause:3.10"
RENEW_INTERVAL = 10.0
LATE_FACTOR = 1.25
SUMMARY = re.compile(r"^I(\d{4} \d\d:\d\d:\d\d\.\d+) .*API requests in the last (\d+)s: (\d+) ",
                     re.M)
CLK_TCK = os.sysconf("SC_CLK_TCK")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
SLO = 5.0  # seconds: the pod startup SLO's p99


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))], 3)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def admin_client(cp: Path, server: str) -> httpx.Client:
    context = ssl.create_default_context(cafile=cp / "pki" / "ca.crt")
    context.load_cert_chain(cp / "pki" / "admin.crt", cp / "pki" / "admin.key")
    return httpx.Client(base_url=server, verify=context, timeout=30.0,
                        limits=httpx.Limits(max_connections=50))


def control_plane(cp: Path) -> str:
    """`control-plane up` with the scheduler, then the controller manager with every controller
    (node lifecycle, garbage collection, service accounts...)."""
    script = [sys.executable, str(SCRIPTS / "control-plane")]
    out = subprocess.run([*script, "up", str(cp), "--controller-manager", "--scheduler"],
                         check=True, capture_output=True, text=True).stdout
    subprocess.run([*script, "start-controller-manager", str(cp), "--controllers", "*"],
                   check=True, capture_output=True)
    return re.search(r"TRIO_KUBELET_APISERVER=(\S+)", out).group(1)  # type: ignore[union-attr]


def micro_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Watch(threading.Thread):
    """One long watch (re-opened from the last resourceVersion); ``handle`` gets each object."""

    def __init__(self, client: httpx.Client, path: str, handle: Any, **params: str) -> None:
        super().__init__(daemon=True)
        self.client, self.path, self.handle, self.params = client, path, handle, params

    def run(self) -> None:
        version = ""
        while True:
            params = {**self.params, "watch": "true", "allowWatchBookmarks": "true"}
            if version:
                params["resourceVersion"] = version
            try:
                with self.client.stream("GET", self.path, params=params,
                                        timeout=httpx.Timeout(30.0, read=None)) as response:
                    for line in response.iter_lines():
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            version = ""
                            break
                        version = event["object"]["metadata"].get("resourceVersion", version)
                        if event["type"] != "BOOKMARK":
                            self.handle(event["type"], event["object"])
            except (httpx.HTTPError, ValueError):
                time.sleep(0.5)


class Observed:
    """What the watches saw, on this machine's monotonic clock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready: dict[str, float] = {}  # node -> first seen Ready
        self.nodes: set[str] = set()
        self.renewals: dict[str, float] = {}  # lease -> last renewTime
        self.gaps: list[tuple[float, float]] = []  # (renewTime, seconds since the last one)
        self.running: dict[str, float] = {}  # pod -> first seen Running and ready
        self.bound: dict[str, float] = {}  # pod -> first seen with a nodeName

    def node(self, kind: str, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        if not name.startswith(PREFIX):
            return
        with self.lock:
            if kind == "DELETED":
                self.nodes.discard(name)
                return
            self.nodes.add(name)
            conditions = node.get("status", {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                self.ready.setdefault(name, time.monotonic())

    def lease(self, kind: str, lease: dict[str, Any]) -> None:
        name = lease["metadata"]["name"]
        renew = lease.get("spec", {}).get("renewTime")
        if not name.startswith(PREFIX) or not renew or kind == "DELETED":
            return
        at = micro_time(renew)
        with self.lock:
            last = self.renewals.get(name)
            if last is not None and at > last:
                self.gaps.append((at, at - last))
            self.renewals[name] = at

    def pod(self, kind: str, pod: dict[str, Any]) -> None:
        if pod.get("spec", {}).get("nodeName"):
            with self.lock:
                self.bound.setdefault(pod["metadata"]["name"], time.monotonic())
        status = pod.get("status", {})
        statuses = status.get("containerStatuses") or []
        if (status.get("phase") == "Running" and statuses
                and all(s.get("ready") for s in statuses)):
            with self.lock:
                self.running.setdefault(pod["metadata"]["name"], time.monotonic())


def control_plane_cpu(cp: Path) -> dict[str, float]:
    """CPU seconds so far of each control-plane process (from its pid file)."""
    seconds = {}
    for name in CONTROL_PLANE:
        with contextlib.suppress(OSError, ValueError):
            seconds[name] = cpu_seconds(int((cp / f"{name}.pid").read_text()))
    return seconds


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores, from /proc/stat."""
    fields = [int(x) / CLK_TCK for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def cpu_percent(before: dict[str, float], after: dict[str, float],
                seconds: float) -> dict[str, float]:
    return {name: round(100 * (after[name] - before[name]) / seconds, 1)
            for name in after if name in before}


def per_second(moments: list[float], start: float) -> dict[str, Any]:
    """How fast things happened: the mean rate over the span from ``start`` to the last one,
    and the most in any one second."""
    if not moments:
        return {"mean": None, "max_1s": None}
    span = max(moments) - start
    buckets = collections.Counter(int(at - start) for at in moments)
    return {"mean": round(len(moments) / span, 1) if span > 0 else None,
            "max_1s": max(buckets.values())}


def wait(condition: Any, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def pod_body(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"bench": "hollow"}},
        "spec": {
            "containers": [{"name": "pause", "image": IMAGE,
                            "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}],
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
        },
    }


def requests_per_minute(log: Path, since: datetime, until: datetime) -> float | None:
    """API requests per minute of the whole process, from summary lines inside the window."""
    year = datetime.now().year
    counts = []
    for stamp, seconds, total in SUMMARY.findall(log.read_text(errors="replace")):
        at = datetime.strptime(f"{year}{stamp}", "%Y%m%d %H:%M:%S.%f")
        if since <= at <= until:
            counts.append(int(total) * 60 / int(seconds))
    return sum(counts) / len(counts) if counts else None


def renewal_figures(gaps: list[float]) -> dict[str, Any]:
    late = [g for g in gaps if g > LATE_FACTOR * RENEW_INTERVAL]
    return {
        "count": len(gaps), "late": len(late),
        "late_percent": round(100 * len(late) / len(gaps), 3) if gaps else None,
        "late_threshold_s": LATE_FACTOR * RENEW_INTERVAL,
        "gap_p50_s": percentile(gaps, 0.5), "gap_p99_s": percentile(gaps, 0.99),
        "gap_max_s": round(max(gaps), 3) if gaps else None,
    }


def create_pods(admin: httpx.Client, count: int, rate: float) -> tuple[dict[str, float], int]:
    """Create ``count`` pods at ``rate``/s (a pool keeps the pace when a request is slow);
    the moment each create returned, and how many failed."""
    created: dict[str, float] = {}
    failures = 0
    start = time.monotonic()

    def create(i: int) -> None:
        nonlocal failures
        name = f"hollow-bench-{i:05d}"
        response = admin.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=pod_body(name))
        if response.status_code == 201:
            created[name] = time.monotonic()
        else:
            failures += 1

    with ThreadPoolExecutor(16) as pool:
        for i in range(count):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pool.submit(create, i)
    return created, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=0, help="pods to create (0: none)")
    parser.add_argument("--rate", type=float, default=20.0, help="pods created per second")
    parser.add_argument("--idle", type=float, default=130.0,
                        help="seconds of idle measurement once every node is Ready")
    parser.add_argument("--rest", type=float, default=60.0,
                        help="seconds of measurement with every pod running, after the wave")
    parser.add_argument("--start-rate", type=float, default=50.0,
                        help="the runner's --start-rate (nodes per second; 0: all at once)")
    parser.add_argument("--control-plane", type=Path, help="reuse a running control plane DIR "
                        "(with kube-scheduler and kube-controller-manager)")
    parser.add_argument("--keep-log", type=Path, help="copy the runner's log here")
    parser.add_argument("--profile", type=Path, help="run the runner under cProfile, stats here")
    args = parser.parse_args()
    if shutil.which("go") is None and subprocess.run(
            [str(SCRIPTS / "build-control-plane"), "--print"], capture_output=True).returncode:
        print(json.dumps({"bench": "hollow", "skipped": "no control-plane binaries and no Go"}))
        return
    result: dict[str, Any] = {"bench": "hollow", "nodes": args.nodes, "pods": args.pods,
                              "rate": args.rate, "loadavg_at_start": load()}
    work = Path(tempfile.mkdtemp(prefix="tk-bench-hollow-"))
    cp = args.control_plane or work / "cp"
    server = control_plane(cp)
    admin = admin_client(cp, server)
    observed = Observed()
    watch = admin_client(cp, server)
    Watch(watch, "/api/v1/nodes", observed.node).start()
    Watch(watch, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
          observed.lease).start()
    Watch(watch, f"/api/v1/namespaces/{NAMESPACE}/pods", observed.pod,
          labelSelector="bench=hollow").start()
    if admin.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default").status_code == 404:
        admin.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                   json={"metadata": {"name": "default"}})
    log = work / "hollow.log"
    start = time.monotonic()
    runner = subprocess.Popen(
        [sys.executable, *(["-m", "cProfile", "-o", str(args.profile)] if args.profile else []),
         "-m", "trio_kubelet", "hollow", "--kubeconfig",
         str(cp / "admin.kubeconfig"), "--nodes", str(args.nodes), "--name-prefix", PREFIX,
         "--root-dir", str(work / "nodes"), "--start-rate", str(args.start_rate)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    pid = runner.pid
    try:
        all_ready = wait(lambda: len(observed.ready) >= args.nodes, 600)
        ready = sorted(at - start for at in observed.ready.values())
        result["nodes_ready"] = {
            "all": all_ready, "count": len(ready),
            "all_ready_s": round(ready[-1], 2) if ready else None,
            "p50_s": percentile(ready, 0.5), "p99_s": percentile(ready, 0.99),
        }
        result["rss_mib_after_ready"] = round(rss_bytes(pid) / 2**20, 1)
        # Idle: let the start-up settle (every node's first status rounds), then measure.
        time.sleep(15)
        idle_from = time.time()
        cpu0, t0, wall0 = cpu_seconds(pid), time.monotonic(), datetime.now()
        time.sleep(args.idle)
        cpu1, t1, wall1 = cpu_seconds(pid), time.monotonic(), datetime.now()
        idle_core = (cpu1 - cpu0) / (t1 - t0)
        rss = rss_bytes(pid)
        per_minute = requests_per_minute(log, wall0, wall1)
        result["idle"] = {
            "seconds": round(t1 - t0, 1),
            "cpu_percent_of_core_total": round(100 * idle_core, 2),
            "cpu_percent_of_core_per_node": round(100 * idle_core / args.nodes, 4),
            "rss_mib_total": round(rss / 2**20, 1),
            "rss_mib_per_node": round(rss / 2**20 / args.nodes, 3),
            "api_requests_per_node_per_minute": (
                round(per_minute / args.nodes, 2) if per_minute is not None else None),
            "loadavg": load(),
        }
        pods_from = time.time()
        if args.pods:
            cpu0, t0, wall0 = cpu_seconds(pid), time.monotonic(), datetime.now()
            cp0, machine0 = control_plane_cpu(cp), machine_busy()
            created, failures = create_pods(admin, args.pods, args.rate)
            wait(lambda: all(name in observed.running for name in created), 300, 0.5)
            cpu1, t1, wall1 = cpu_seconds(pid), time.monotonic(), datetime.now()
            cp1, machine1 = control_plane_cpu(cp), machine_busy()
            with observed.lock:
                running, bound = dict(observed.running), dict(observed.bound)
            latencies = [running[name] - at for name, at in created.items() if name in running]
            scheduled = [bound[name] - at for name, at in created.items() if name in bound]
            on_node = [running[name] - bound[name] for name in created
                       if name in running and name in bound]
            per_minute = requests_per_minute(log, wall0, wall1)
            result["pods_phase"] = {
                "created": len(created), "create_failures": failures,
                "running": len(latencies),
                "startup_p50_s": percentile(latencies, 0.5),
                "startup_p99_s": percentile(latencies, 0.99),
                "startup_max_s": round(max(latencies), 3) if latencies else None,
                "startup_over_slo": len([x for x in latencies if x > SLO]),
                "create_to_bound_p50_s": percentile(scheduled, 0.5),
                "create_to_bound_p99_s": percentile(scheduled, 0.99),
                "bound_to_running_p50_s": percentile(on_node, 0.5),
                "bound_to_running_p99_s": percentile(on_node, 0.99),
                "bound_per_s": per_second([bound[n] for n in created if n in bound], t0),
                "running_per_s": per_second([running[n] for n in created if n in running], t0),
                "seconds": round(t1 - t0, 1),
                "cpu_percent_of_core_total": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
                "control_plane_cpu_percent_of_core": cpu_percent(cp0, cp1, t1 - t0),
                # the whole machine (every core, everyone's processes), % of all its cores
                "machine_busy_percent": round(
                    100 * (machine1[0] - machine0[0]) / (machine1[1] - machine0[1]), 1),
                "rss_mib_total": round(rss_bytes(pid) / 2**20, 1),
                "rss_mib_per_node": round(rss_bytes(pid) / 2**20 / args.nodes, 3),
                "api_requests_per_node_per_minute": (
                    round(per_minute / args.nodes, 2) if per_minute is not None else None),
                "loadavg": load(),
            }
            # At rest with the pods: what running them costs (resyncs, status rounds, PLEG).
            time.sleep(5)
            rest_from = time.time()
            cpu0, t0, cp0 = cpu_seconds(pid), time.monotonic(), control_plane_cpu(cp)
            time.sleep(args.rest)
            cpu1, t1, cp1 = cpu_seconds(pid), time.monotonic(), control_plane_cpu(cp)
            rest_until = time.time()
            result["at_rest_with_pods"] = {
                "seconds": round(t1 - t0, 1),
                "cpu_percent_of_core_total": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
                "cpu_percent_of_core_per_node": round(
                    100 * (cpu1 - cpu0) / (t1 - t0) / args.nodes, 4),
                "control_plane_cpu_percent_of_core": cpu_percent(cp0, cp1, t1 - t0),
                "rss_mib_per_node": round(rss_bytes(pid) / 2**20 / args.nodes, 3),
                "loadavg": load(),
            }
            deleted_at = time.monotonic()
            admin.delete(f"/api/v1/namespaces/{NAMESPACE}/pods", timeout=600,
                         params={"labelSelector": "bench=hollow"})
            gone = wait(lambda: not admin.get(
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                params={"labelSelector": "bench=hollow", "limit": "1"}).json()["items"], 300, 1)
            result["pods_phase"]["all_deleted_s"] = (
                round(time.monotonic() - deleted_at, 1) if gone else None)
        with observed.lock:
            renewals = list(observed.gaps)
        result["lease_renewals_start_up"] = renewal_figures(
            [gap for at, gap in renewals if at < idle_from])
        result["lease_renewals_idle"] = renewal_figures(
            [gap for at, gap in renewals if idle_from <= at < pods_from])
        if args.pods:
            result["lease_renewals_with_pods"] = renewal_figures(
                [gap for at, gap in renewals if pods_from <= at < rest_from])
            result["lease_renewals_at_rest_with_pods"] = renewal_figures(
                [gap for at, gap in renewals if rest_from <= at < rest_until])
    finally:
        stopped = time.monotonic()
        runner.send_signal(signal.SIGTERM)
        try:
            runner.wait(120)
        except subprocess.TimeoutExpired:
            runner.kill()
        result["exit"] = {"seconds": round(time.monotonic() - stopped, 2),
                          "code": runner.returncode}
        result["exit"]["nodes_left"] = len([
            n for n in admin.get("/api/v1/nodes").json()["items"]
            if n["metadata"]["name"].startswith(PREFIX)])
        result["loadavg_at_end"] = load()
        if args.keep_log:
            shutil.copy(log, args.keep_log)
        if args.control_plane is None:
            subprocess.run([sys.executable, str(SCRIPTS / "control-plane"), "down", str(cp)],
                           capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

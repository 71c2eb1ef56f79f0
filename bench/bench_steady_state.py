"""The agent at rest with 110 running pods: CPU (% of one core), RSS, and PLEG relist duration.

Runs the agent as its own process (``python -m trio_kubelet`` with Go kubelet flags and the
default configuration) on a manifest directory of 110 single-container pods (busybox
``sleep 3600``), against

- ``--runtime fake`` (default): the in-memory fake runtime, served by
  ``bench/fake_runtime_server.py`` in a separate process so its CPU is not counted; or
- ``--runtime containerd``: a private containerd (``scripts/containerd-env start`` under /tmp,
  stopped at the end; needs root).

Once every pod's container runs (polled through a CRI client of this process) and a settle
period has passed, the agent's CPU time (``/proc/PID/stat`` utime+stime, all threads) and RSS
(``/proc/PID/status`` VmRSS, sampled each second) are read over the window. The window is the
default resync period (``syncFrequency`` 60 s), so it holds one resync of every pod, 60 PLEG
relists and three full manifest rescans (``fileCheckFrequency`` 20 s), as a node at rest has.

The agent does not export its relist timing, so after the window this process runs the agent's
relist code (``trio_kubelet.runtime.inspect.relist`` over the same ``CRIClient``) against the
same runtime and reports its latency: the same work on the same data, without the agent's
other tasks competing for the thread.

Prints one JSON object. Usage:
``python bench/bench_steady_state.py [--runtime fake|containerd] [--pods 110] [--window 60]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import trio

from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import open_cri_client
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError
from trio_kubelet.runtime.inspect import relist

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONTAINERD_ENV = ROOT / "scripts" / "containerd-env"
NODE = "bench"
IMAGE = "docker.io/library/busybox:1.36"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

_MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {app}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: sleep
    image: {image}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
{extra}"""


def sleep_pod_manifest(name: str, image: str, app: str, extra: str = "") -> str:
    """A static pod of one ``sleep`` container (the benches' pods); ``extra`` is appended
    to the container's lines (probes)."""
    return _MANIFEST.format(name=name, image=image, app=app, extra=extra)


# --- processes --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (not of its children)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of proc(5)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def fake_runtime(workdir: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    socket = workdir / "fake.sock"
    log = (workdir / "fake.log").open("w")
    proc = subprocess.Popen([sys.executable, str(HERE / "fake_runtime_server.py"), str(socket)],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"fake runtime did not start: {(workdir / 'fake.log').read_text()}")
        yield f"unix://{socket}", proc
    finally:
        stop_process(proc)
        log.close()


def containerd_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (containerd, runc, network namespaces)"
    missing = [tool for tool in ("containerd", "ctr", "runc") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed: run `scripts/containerd-env install`"
    return None


def _containerd_env(major: int, *args: str) -> subprocess.CompletedProcess[str]:
    # containerd 2.x's first start builds it (scripts/build-containerd2, ~6 min).
    env = {**os.environ, "TRIO_KUBELET_CONTAINERD": str(major)}
    return subprocess.run(["bash", str(CONTAINERD_ENV), *args], capture_output=True, text=True,
                          timeout=1200, env=env)


@contextmanager
def private_containerd(major: int = 1) -> Iterator[tuple[str, None]]:
    """A new private containerd (Debian's 1.6, or 2.x), stopped and removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="tkb-ctrd-", dir="/tmp"))
    done = _containerd_env(major, "start", str(root))
    if done.returncode != 0:
        _containerd_env(major, "stop", str(root))
        sys.exit(f"containerd-env start failed:\n{done.stderr}")
    try:
        yield f"unix://{root / 'containerd.sock'}", None
    finally:
        done = _containerd_env(major, "stop", str(root))  # removes every pod through CRI first
        if done.returncode == 0:
            shutil.rmtree(root, ignore_errors=True)
        else:
            sys.stderr.write(f"containerd-env stop failed, kept {root}:\n{done.stderr}\n")


# --- the runtime as this process sees it ------------------------------------------------------


async def count_running(endpoint: str) -> int:
    """Containers in RUNNING state that belong to a pod (carry our pod-UID label)."""
    async with open_cri_client(endpoint, timeout=30) as client:
        try:
            containers = await client.list_containers(v1.ContainerFilter(
                state=v1.ContainerStateValue(state=v1.ContainerState.CONTAINER_RUNNING)))
        except CRIError:
            return 0
    return sum(1 for c in containers if labels.POD_UID in c.labels)


async def relist_latency(endpoint: str, relists: int) -> dict[str, Any]:
    samples, cpu = [], []
    async with open_cri_client(endpoint, timeout=30) as client:
        for _ in range(5):
            pods = await relist(client)
        for _ in range(relists):
            start, start_cpu = time.perf_counter(), time.process_time()
            pods = await relist(client)
            samples.append((time.perf_counter() - start) * 1000)
            cpu.append((time.process_time() - start_cpu) * 1000)
            await trio.sleep(0.05)
    samples.sort()
    cpu.sort()
    return {
        "pleg_relist_p50_ms": round(samples[len(samples) // 2], 2),
        "pleg_relist_p99_ms": round(samples[min(len(samples) - 1, int(0.99 * len(samples)))], 2),
        # The client's own CPU per relist (this thread): the agent's share of the latency.
        "pleg_relist_client_cpu_p50_ms": round(cpu[len(cpu) // 2], 2),
        "pleg_relist_pods": len(pods),
        "pleg_relist_containers": sum(len(p.containers) for p in pods.values()),
    }


# --- the run ----------------------------------------------------------------------------------


def write_manifests(directory: Path, pods: int) -> None:
    directory.mkdir(parents=True)
    for index in range(pods):
        name = f"steady-{index:03d}"
        (directory / f"{name}.yaml").write_text(sleep_pod_manifest(name, IMAGE, "steady"))


def wait_all_running(endpoint: str, pods: int, agent: subprocess.Popen[Any], timeout: float,
                     agent_log: Path) -> float:
    start = time.monotonic()
    while True:
        if agent.poll() is not None:
            raise RuntimeError(f"the agent exited ({agent.returncode}):\n"
                               f"{agent_log.read_text()[-3000:]}")
        running = trio.run(count_running, endpoint)
        if running >= pods:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"only {running}/{pods} containers running after {timeout}s; "
                               f"agent log: {agent_log}")
        time.sleep(1.0)


def start_agent(manifests: Path, endpoint: str, workdir: Path, log: IO[str],
                *flags: str) -> subprocess.Popen[Any]:
    """The agent as its own process, with the default configuration and ``flags``."""
    return subprocess.Popen(
        [sys.executable, "-m", "trio_kubelet",
         "--pod-manifest-path", str(manifests),
         "--container-runtime-endpoint", endpoint,
         "--cgroups-per-qos=false",  # fake pods: no cgroups on the host
         "--root-dir", str(workdir / "root"),
         "--pod-logs-dir", str(workdir / "pod-logs"),
         "--hostname-override", NODE, "--node-ip", "127.0.0.1", *flags],
        stdout=log, stderr=subprocess.STDOUT)


def measure(pid: int, window: float) -> dict[str, float]:
    rss = [rss_mib(pid)]
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    deadline = t0 + window
    while (now := time.monotonic()) < deadline:
        time.sleep(min(1.0, deadline - now))
        rss.append(rss_mib(pid))
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    return {
        "cpu_percent_of_core": round(100 * (cpu1 - cpu0) / (t1 - t0), 2),
        "rss_mib": round(rss[-1], 1),
        "rss_max_mib": round(max(rss), 1),
        "window_s": round(t1 - t0, 1),
    }


def run(runtime: str, pods: int, window: float, settle: float, start_timeout: float,
        keep: bool) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="tkb-steady-", dir="/tmp"))
    manifests = workdir / "manifests"
    write_manifests(manifests, pods)
    agent_log = workdir / "agent.log"
    runtime_cm = fake_runtime(workdir) if runtime == "fake" else private_containerd()
    result: dict[str, Any] = {"bench": "steady_state", "pods": pods, "runtime": runtime}
    try:
        with runtime_cm as (endpoint, runtime_proc):
            with agent_log.open("w") as log:
                agent = start_agent(manifests, endpoint, workdir, log)
            try:
                result["all_running_after_s"] = round(
                    wait_all_running(endpoint, pods, agent, start_timeout, agent_log), 1)
                time.sleep(settle)
                fake_cpu1 = cpu_seconds(runtime_proc.pid) if runtime_proc is not None else 0.0
                result.update(measure(agent.pid, window))
                if runtime_proc is not None:
                    fake_cpu2 = cpu_seconds(runtime_proc.pid)
                    result["fake_runtime_cpu_percent_of_core"] = round(
                        100 * (fake_cpu2 - fake_cpu1) / result["window_s"], 2)
                if agent.poll() is not None:
                    raise RuntimeError(f"the agent exited during the window ({agent.returncode})")
            finally:
                stop_process(agent)
            # After the agent stopped, so nothing competes with the relists.
            result.update(trio.run(relist_latency, endpoint, 100))
            result["pleg_relist_note"] = ("trio_kubelet.runtime.inspect.relist run by the bench "
                                          "process against the same runtime, 100 times; "
                                          "client_cpu = this thread's CPU time per relist")
    finally:
        text = agent_log.read_text(errors="replace") if agent_log.exists() else ""
        result["agent_log_warnings"] = sum(1 for line in text.splitlines()
                                           if line[:1] in ("W", "E"))
        if keep:
            result["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return result


def tree_version() -> str:
    """The commit measured, "+dirty" when src/ has uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"
    return f"{head}+dirty" if dirty else head or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=("fake", "containerd"), default="fake")
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--window", type=float, default=60.0, help="sampling window (s)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="wait after every pod runs, before sampling (s)")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    if args.runtime == "containerd":
        skip = containerd_unavailable()
        if skip is not None:
            print(json.dumps({"bench": "steady_state", "runtime": "containerd", "skipped": skip}))
            return
    load_at_start = round(os.getloadavg()[0], 2)  # other work on the machine
    result = run(args.runtime, args.pods, args.window, args.settle, args.start_timeout, args.keep)
    result["tree"] = tree_version()
    result["loadavg_1m_at_start"] = load_at_start
    result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    result["python"] = platform.python_version()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""The Go kubelet and trio-kubelet one after the other, same node, same config, same N pods.

Each agent gets a fresh private containerd (``scripts/containerd-env``: Debian's 1.6 or 2.x;
CRI records one agent leaves change the other's decisions: a stale exited container puts the
Go kubelet's first restart into back-off), its own root and pod-log directories, and a
private ``cgroupRoot`` (both agents remove pod cgroups under their root that they do not know,
so agents sharing a host must not share one). Both read the same KubeletConfiguration
(``failCgroupV1: false``, ``cgroupDriver: cgroupfs``, no API server, ports of their own) with
N static pods (busybox ``sleep 3600``, ``terminationGracePeriodSeconds: 1``). For each agent:

- ``all_running_s``: agent started → every pod's container running (polled every second
  through a CRI client of this process);
- ``cpu_percent_of_core``, ``rss_mib``: at rest, over ``--window`` seconds after a settle;
- ``kill_p50_s``, ``kill_p99_s``: a container's process SIGKILLed → a new one of that pod
  running (bench_kill_restart.py's measurement, ``--kills`` different pods);
- ``teardown_s``: every manifest removed → no container of the pods running.

``--agents floor,go,trio`` adds what containerd alone takes, on a fresh containerd of its own:
the fewest CRI calls that start the N pods (RunPodSandbox, CreateContainer, StartContainer,
all pods at once, from this process) and stop them (StopContainer with the same 2 s grace,
then at once StopPodSandbox, pod by pod, as the Go kubelet does), timed the same way. No
agent starts the pods faster than that on this machine; the stop shows what that order costs.
With it the output also has each agent's seconds over the floor (``added_to_floor_s``).

Before each run the page cache is dropped (and with it the memory cgroups earlier runs left
behind) and the agent's files are read back in. trio-kubelet runs from this process's
``trio_kubelet``, byte-compiled first as an install would leave it. The Go kubelet is
``kubelet`` from ``scripts/build-control-plane --kubelet`` (built from the Go module proxy the
first time, cached) unless ``--go-kubelet PATH`` names one. It runs in a mount namespace of
its own in which the kernel settings it insists on writing (``vm.overcommit_memory``,
``kernel.panic_on_oops``, ...; ``protectKernelDefaults: true`` would refuse to start instead)
are files of this bench, so the machine's stay as they are;
its pods here need no mounts that containerd would have to see. Prints one JSON
object with both agents' figures, the ratios (trio / Go) and the load average around each run.
Usage: ``python bench/bench_side_by_side.py [--containerd 1|2] [--pods 110] [--kills 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio
from bench_kill_restart import kill_each, percentile, write_pods
from bench_steady_state import (
    IMAGE,
    NODE,
    containerd_unavailable,
    count_running,
    measure,
    private_containerd,
    stop_process,
    tree_version,
    wait_all_running,
)

from trio_kubelet.runtime import labels
from trio_kubelet.runtime.client import CRIClient, open_cri_client
from trio_kubelet.runtime.cri.runtime import v1

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "scripts" / "build-control-plane"
CGROUP_FS = Path("/sys/fs/cgroup")
CONFIG = """\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
staticPodPath: {manifests}
containerRuntimeEndpoint: {endpoint}
podLogsDir: {logs}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
failCgroupV1: false
failSwapOn: false
port: {port}
healthzPort: {healthz_port}
readOnlyPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def cgroup_root(name: str) -> Iterator[str]:
    """``/name`` in every cgroup v1 hierarchy (the Go kubelet wants it in each; cpuset's
    needs its parent's cpus and mems), removed with whatever the agent left in it."""
    made = []
    for hierarchy in sorted(p for p in CGROUP_FS.iterdir() if (p / "cgroup.procs").exists()):
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        made.append(path)
        if hierarchy.name == "cpuset":
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((hierarchy / knob).read_text())
    try:
        yield name
    finally:
        for path in made:
            for leftover in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if leftover.is_dir():
                    _rmdir(leftover)
            _rmdir(path)


def _rmdir(path: Path) -> None:
    """Remove an empty cgroup; one whose last processes are still exiting is busy a moment."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    sys.stderr.write(f"could not remove cgroup {path}\n")


def go_kubelet(explicit: str | None) -> str:
    if explicit:
        return explicit
    done = subprocess.run(["bash", str(BUILD), "--kubelet"], capture_output=True, text=True,
                          timeout=3600)
    if done.returncode != 0:
        sys.exit(f"could not build the Go kubelet:\n{done.stderr}")
    return str(Path(done.stdout.strip()) / "kubelet")


# The kernel settings the Go kubelet writes at start (setupKernelTunables).
GO_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
              "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Each one a copy of its value bind-mounted over it, in a private mount namespace.
_SHIELD = r"""set -e
for key in {keys}; do
  copy={workdir}/sysctl-${{key//\//-}}
  cat "/proc/sys/$key" >"$copy"
  mount --bind "$copy" "/proc/sys/$key"
done
exec "$@"
"""


def compile_agent() -> None:
    """Byte-compile trio_kubelet, as installing it does, so that the agent under test does not
    compile its modules at each start (which with ``PYTHONDONTWRITEBYTECODE`` set, or a
    read-only tree, costs it ~0.6 s of CPU at every start on this machine)."""
    import trio_kubelet

    package = Path(trio_kubelet.__file__).resolve().parent
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], env=env,
                   check=True, stdout=subprocess.DEVNULL)


def fresh_kernel_state(warm: list[str]) -> int:
    """Drop the page cache before each run, then read the agent's files back in.

    Every run leaves ~550 memory cgroups behind that the kernel keeps while page cache is
    charged to them; they piled up to thousands over a series and made each later run slower
    than the one before. Returns how many memory cgroups there were before the drop.
    """
    before = next(int(line.split()[2]) for line in Path("/proc/cgroups").read_text().splitlines()
                  if line.startswith("memory\t"))
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    subprocess.run(warm, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return before


def warm_command(agent: str, binary: str) -> list[str]:
    """Reads what the agent's start would read: its binary, or its Python modules."""
    if agent == "go":
        return [binary, "--version"]
    return [sys.executable, "-c", "import trio_kubelet.agent, trio_kubelet.cli"]


def agent_command(agent: str, binary: str, config: Path, workdir: Path) -> list[str]:
    common = ["--config", str(config), "--root-dir", str(workdir / "root"),
              "--hostname-override", NODE, "--node-ip", "127.0.0.1"]
    if agent == "go":
        shield = _SHIELD.format(keys=" ".join(GO_SYSCTLS), workdir=workdir)
        return ["unshare", "--mount", "--propagation", "private", "bash", "-c", shield,
                "go-kubelet", binary, *common]
    return [sys.executable, "-m", "trio_kubelet", *common]


async def wait_none_running(endpoint: str, timeout: float) -> float:
    """Seconds until no container of the pods runs (polled every 0.1 s), from now."""
    start = time.monotonic()
    while await count_running(endpoint) > 0:
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"containers still running {timeout}s after their stop began")
        await trio.sleep(0.1)
    return time.monotonic() - start


def run_agent(agent: str, binary: str, major: int, pods: int, kills: int, window: float,
              settle: float, start_timeout: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix=f"tkb-sbs-{agent}-", dir="/tmp"))
    manifests, names = write_pods(workdir, "sbs", pods)
    log_path = workdir / "agent.log"
    before = fresh_kernel_state(warm_command(agent, binary))
    result: dict[str, Any] = {"memory_cgroups_before": before,
                              "load_1m_before": round(os.getloadavg()[0], 2)}
    try:
        # The cgroups go last, after containerd has removed every container.
        with cgroup_root(f"tkb-sbs-{os.getpid()}") as root, \
                private_containerd(major) as (endpoint, _), log_path.open("w") as log:
            config = workdir / "kubelet.yaml"
            config.write_text(CONFIG.format(
                manifests=manifests, endpoint=endpoint, logs=workdir / "pod-logs",
                cgroup_root=root, port=free_port(), healthz_port=free_port()))
            process = subprocess.Popen(agent_command(agent, binary, config, workdir),
                                       stdout=log, stderr=subprocess.STDOUT)
            try:
                result["all_running_s"] = round(
                    wait_all_running(endpoint, pods, process, start_timeout, log_path), 1)
                time.sleep(settle)
                result.update(measure(process.pid, window))
                samples = kill_each(endpoint, names[:kills], 2.0)
                result["kill_p50_s"] = round(percentile(samples, 0.5), 3)
                result["kill_p99_s"] = round(percentile(samples, 0.99), 3)
                result["kill_samples_s"] = [round(s, 3) for s in samples]
                for manifest in manifests.iterdir():
                    manifest.unlink()
                result["teardown_s"] = round(
                    trio.run(wait_none_running, endpoint, start_timeout), 2)
                if process.poll() is not None:
                    raise RuntimeError(f"{agent} exited ({process.returncode}): {log_path}")
            finally:
                stop_process(process)
    except BaseException:
        sys.stderr.write(f"{agent} failed; its log: {log_path}\n")
        raise
    result["load_1m_after"] = round(os.getloadavg()[0], 2)
    shutil.rmtree(workdir, ignore_errors=True)
    return result


async def _floor_start(client: CRIClient, root: str, logs: Path, index: int) -> tuple[str, str]:
    """One pod as an agent would start it, without the agent: its sandbox, then its container."""
    uid = f"floor-{os.getpid()}-{index:03d}"
    pod_labels = {labels.POD_UID: uid}
    # As for any pod without shareProcessNamespace: `sleep` is its container's PID 1 and
    # ignores SIGTERM, so the 2 s grace runs out and SIGKILL follows, as under the agents.
    own_pids = v1.NamespaceOption(pid=v1.NamespaceMode.CONTAINER)
    sandbox = v1.PodSandboxConfig(
        metadata=v1.PodSandboxMetadata(name=f"floor-{index:03d}", uid=uid, namespace="default"),
        hostname=f"floor-{index:03d}", log_directory=str(logs / uid), labels=pod_labels,
        linux=v1.LinuxPodSandboxConfig(
            cgroup_parent=f"/{root}/kubepods/besteffort/pod{uid}",
            security_context=v1.LinuxSandboxSecurityContext(namespace_options=own_pids)))
    sandbox_id = await client.run_pod_sandbox(sandbox)
    container = v1.ContainerConfig(
        metadata=v1.ContainerMetadata(name="sleep"), image=v1.ImageSpec(image=IMAGE),
        command=["sleep", "3600"], log_path="sleep/0.log", labels=pod_labels,
        linux=v1.LinuxContainerConfig(
            security_context=v1.LinuxContainerSecurityContext(namespace_options=own_pids)))
    container_id = await client.create_container(sandbox_id, container, sandbox)
    await client.start_container(container_id)
    return sandbox_id, container_id


async def _floor(endpoint: str, root: str, logs: Path, pods: int, poll: float,
                 timeout: float) -> dict[str, Any]:
    started: list[tuple[str, str]] = []

    async def start(index: int) -> None:
        started.append(await _floor_start(client, root, logs, index))

    async def stop(sandbox_id: str, container_id: str) -> None:
        await client.stop_container(container_id, 2)
        await client.stop_pod_sandbox(sandbox_id)

    result: dict[str, Any] = {}
    async with open_cri_client(endpoint, timeout=120) as client:
        async with trio.open_nursery() as nursery:
            for index in range(pods):
                nursery.start_soon(start, index)
            began = time.monotonic()
            while await count_running(endpoint) < pods:  # polled as `wait_all_running` does
                await trio.sleep(poll)
            result["all_running_s"] = round(time.monotonic() - began, 1)
        await trio.sleep(5.0)
        async with trio.open_nursery() as nursery:
            for sandbox_id, container_id in started:
                nursery.start_soon(stop, sandbox_id, container_id)
            result["teardown_s"] = round(await wait_none_running(endpoint, timeout), 2)
    return result


def run_floor(major: int, pods: int, timeout: float) -> dict[str, Any]:
    """containerd alone: `_floor` on a fresh private containerd with its own cgroup root."""
    result: dict[str, Any] = {"memory_cgroups_before": fresh_kernel_state(["true"]),
                              "load_1m_before": round(os.getloadavg()[0], 2)}
    logs = Path(tempfile.mkdtemp(prefix="tkb-sbs-floor-", dir="/tmp"))
    with cgroup_root(f"tkb-sbs-{os.getpid()}") as root, private_containerd(major) as (endpoint, _):
        result.update(trio.run(_floor, endpoint, root, logs, pods, 1.0, timeout))
    shutil.rmtree(logs, ignore_errors=True)
    result["load_1m_after"] = round(os.getloadavg()[0], 2)
    return result


FIGURES = ("all_running_s", "cpu_percent_of_core", "rss_mib", "kill_p50_s", "kill_p99_s",
           "teardown_s")
FLOOR_FIGURES = ("all_running_s", "teardown_s")  # what the floor measures too


def added_to_floor(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each agent's seconds over containerd alone in the same invocation: on a machine where
    containerd keeps every core busy, the part of a start or a teardown an agent decides
    (negative where the agent's order of calls beats the floor's)."""
    floor = result["floor"]
    return {agent: {figure: round(result[agent][figure] - floor[figure], 2)
                    for figure in FLOOR_FIGURES}
            for agent in ("go", "trio") if agent in result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containerd", type=int, choices=(1, 2), default=2)
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--window", type=float, default=60.0, help="CPU/RSS window at rest (s)")
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--go-kubelet", help="a Go kubelet binary (default: build v1.36.3)")
    parser.add_argument("--agents", default="go,trio",
                        help="which, in this order: go, trio, floor (containerd alone)")
    args = parser.parse_args()
    result: dict[str, Any] = {"bench": "side_by_side", "containerd": args.containerd,
                              "pods": args.pods, "kills": args.kills, "window_s": args.window}
    skip = containerd_unavailable()
    if skip is not None or args.kills > args.pods:
        result["skipped"] = skip or "--kills must not exceed --pods (each pod is killed once)"
        print(json.dumps(result))
        return
    binary = go_kubelet(args.go_kubelet) if "go" in args.agents else ""
    if "trio" in args.agents:
        compile_agent()
    for agent in args.agents.split(","):
        if agent == "floor":
            result[agent] = run_floor(args.containerd, args.pods, args.start_timeout)
            continue
        result[agent] = run_agent(agent, binary, args.containerd, args.pods, args.kills,
                                  args.window, args.settle, args.start_timeout)
    if "go" in result and "trio" in result:
        result["trio_over_go"] = {figure: round(result["trio"][figure] / result["go"][figure], 2)
                                  for figure in FIGURES if result["go"].get(figure)}
    if "floor" in result:
        result["added_to_floor_s"] = added_to_floor(result)
    result["tree"] = tree_version()
    result["cpus"] = os.cpu_count()
    result["python"] = platform.python_version()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

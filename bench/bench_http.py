"""HTTP API latency with 110 pods: p50/p99 of /healthz, /pods, /stats/summary, /metrics/cadvisor.

Runs the agent as its own process, like ``bench_steady_state.py`` (``python -m trio_kubelet`` on
110 busybox ``sleep 3600`` manifests, the fake runtime served by ``bench/fake_runtime_server.py``
in a third process), with its servers on 127.0.0.1 only: the authenticated HTTPS port
(``--authorization-mode AlwaysAllow --anonymous-auth=true``), the read-only port and the healthz
port, all on free ports picked here. Once ``/pods`` lists every pod Running and
``/stats/summary`` answers 200, this process drives 50 concurrent clients (keep-alive HTTP/1.1
connections framed by h11 on trio, ``KeepAliveClient``: httpx cost ~3 ms of CPU a request and
measured itself, a p99 of 4.4 ms against a server that does nothing) against each endpoint in
turn: ``healthz`` on the healthz port (its own small server), ``healthz_on_quart`` the same
answer through Quart-Trio on the read-only port, then ``pods``, ``summary`` and
``cadvisor``. Paced first (the steady state: right after 8,000 flat-out requests the agent's
latencies stay raised for a while; the paced healthz p99 was 10 ms instead of 6.6 in one A/B on a
quiet machine), then flat out:

- ``flat``: plain HTTP, ``--requests`` requests per endpoint, 50 in flight;
- ``flat_https``: the authenticated port (TLS, not verified), ``healthz`` there being Quart's;
- ``paced``: plain HTTP, each of the 50 clients sends one request every 0.5 s for ``--paced``
  seconds (100 requests/s), since flat-out load on 2 vCPUs measures the load generator too;
- ``floor``: ``/healthz`` flat out and paced against ``bare_quart.py``, a Quart-Trio app with
  that one route and nothing else in its process, on the kubelet's own server
  (``floor_bare_quart_healthz``) and on Hypercorn (``floor_bare_quart_on_hypercorn_healthz``):
  what the required stack and this client cost on this machine before the kubelet does
  anything (its ``agent_*`` figures are the bare server's).

Each client first sends one unmeasured request (opening its keep-alive connection, TLS included),
then all start together. Any non-200 answer or exception counts as an error. Per endpoint and
mode, ``agent_cpu_percent_of_core`` is the agent's utime+stime over the run and
``load_generator_cpu_percent_of_core`` this process's CPU: near 100 means the flat-out numbers
measure the client as much as the agent; ``agent_cpu_ms_per_request`` is the agent's CPU per
request (background work included), the figure to compare when latencies are queueing.
``--profile FILE`` runs the agent under cProfile and writes its pstats to FILE. The fake
runtime's cgroups do not exist, so the summary carries few figures; ``summary_at_ready_*`` and
``summary_at_end_*`` report what it holds.
Prints one JSON object. Usage:
``python bench/bench_http.py [--pods 110] [--clients 50] [--requests 1000] [--paced 10]
[--profile FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h11
import trio
from bench_steady_state import (
    cpu_seconds,
    fake_runtime,
    sleep_pod_manifest,
    stop_process,
    tree_version,
)

NODE = "bench"
IMAGE = "docker.io/library/busybox:1.36"
ENDPOINTS = ("/healthz", "/pods", "/stats/summary", "/metrics/cadvisor")
KEYS = {"/healthz": "healthz", "/pods": "pods", "/stats/summary": "summary",
        "/metrics/cadvisor": "cadvisor"}
TARGETS = {"healthz_p99_ms": 5, "pods_p99_ms": 50, "summary_p99_ms": 100, "cadvisor_p99_ms": 100}
REQUEST_TIMEOUT = 30.0
# What a failed request of the load raises: counted as an error by its type.
LOAD_ERRORS = (OSError, trio.BrokenResourceError, trio.TooSlowError, h11.ProtocolError)
PHASE_TIMEOUT = 300.0

def free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return round(sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))], 2)


# --- readiness --------------------------------------------------------------------------------


async def wait_ready(httpx: Any, base: str, pods: int, agent: subprocess.Popen[Any],
                     timeout: float, agent_log: Path) -> dict[str, Any]:
    start = time.monotonic()
    pods_ready_at = None
    async with httpx.AsyncClient(base_url=base, timeout=REQUEST_TIMEOUT) as client:
        while True:
            if agent.poll() is not None:
                raise RuntimeError(f"the agent exited ({agent.returncode}):\n"
                                   f"{agent_log.read_text(errors='replace')[-3000:]}")
            running = 0
            summary_status = None
            try:
                answer = await client.get("/pods")
                if answer.status_code == 200:
                    running = sum(1 for item in answer.json().get("items") or []
                                  if (item.get("status") or {}).get("phase") == "Running")
                if running >= pods and pods_ready_at is None:
                    pods_ready_at = time.monotonic() - start
                summary = await client.get("/stats/summary")
                summary_status = summary.status_code
            except httpx.HTTPError:
                pass
            if pods_ready_at is not None and summary_status == 200:
                return {"all_running_after_s": round(pods_ready_at, 1),
                        "summary_ready_after_s": round(time.monotonic() - start, 1),
                        "summary": summary.json()}
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"not ready after {timeout}s: {running}/{pods} running, "
                                   f"/stats/summary {summary_status}; agent log: {agent_log}")
            await trio.sleep(0.5)


def describe_summary(summary: dict[str, Any], prefix: str) -> dict[str, Any]:
    """What the summary holds: with the fake runtime the pods' cgroups do not exist."""
    pods = summary.get("pods") or []
    node = summary.get("node") or {}
    figures = {
        "pods": len(pods),
        "pods_with_cpu": sum(1 for pod in pods
                             if (pod.get("cpu") or {}).get("usageNanoCores") is not None),
        "containers": sum(len(pod.get("containers") or []) for pod in pods),
        "node_has_cpu": (node.get("cpu") or {}).get("usageNanoCores") is not None,
        "node_has_memory": (node.get("memory") or {}).get("workingSetBytes") is not None,
    }
    return {prefix + key: value for key, value in figures.items()}


# --- load -------------------------------------------------------------------------------------


class KeepAliveClient:
    """One keep-alive HTTP/1.1 connection, framed by h11, for the load.

    httpx's AsyncClient cost this process ~3 ms of CPU a request; against a trio server that
    only writes a fixed answer, 50 httpx clients at 100 requests/s measured a p99 of 4.4 ms,
    this client 1.65 ms (a Go net/http client 1.4 ms). So the latencies are the server's.
    """

    def __init__(self, base: str) -> None:
        url = urlsplit(base)
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = url.scheme == "https"
        self._stream: trio.abc.Stream | None = None
        self._conn = h11.Connection(h11.CLIENT)

    async def _connect(self) -> trio.abc.Stream:
        stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
        if self.tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            stream = trio.SSLStream(stream, context, server_hostname=self.host)
        self._conn = h11.Connection(h11.CLIENT)
        return stream

    async def get(self, path: str) -> tuple[int, int]:
        """``(status, body size)`` of ``GET path``; any failure closes the connection."""
        try:
            return await self._get(path)
        except BaseException:
            await self.aclose()
            raise

    async def _get(self, path: str) -> tuple[int, int]:
        if self._stream is None:
            self._stream = await self._connect()
        stream, conn = self._stream, self._conn
        request = h11.Request(method="GET", target=path, headers=[("host", self.host)])
        await stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
        status, size = 0, 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(1 << 16))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("closed by the server mid-response")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.aclose()
        return status, size

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await trio.aclose_forcefully(stream)


async def drive(base: str, path: str, clients: int, *, total: int | None = None,
                period: float | None = None, duration: float | None = None) -> dict[str, Any]:
    """``total`` requests flat out over ``clients`` connections, or each client every ``period``
    seconds for ``duration`` seconds. Returns latencies and errors."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    sizes: list[int] = []
    remaining = [total or 0]
    attempts = [0]
    warm = [0]
    warmed = trio.Event()
    started = [0.0]

    def error(kind: str) -> None:
        errors[kind] = errors.get(kind, 0) + 1

    async def one(client: KeepAliveClient) -> None:
        attempts[0] += 1
        start = time.perf_counter()
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                status, size = await client.get(path)
        except LOAD_ERRORS as exc:
            error(type(exc).__name__)
            return
        latencies.append((time.perf_counter() - start) * 1000)
        sizes.append(size)
        if status != 200:
            error(f"status {status}")

    async def worker(index: int) -> None:
        client = KeepAliveClient(base)
        # One unmeasured request opens the keep-alive connection (TCP, TLS handshake).
        try:
            with trio.fail_after(REQUEST_TIMEOUT):
                await client.get(path)
        except LOAD_ERRORS as exc:
            error(f"warm-up {type(exc).__name__}")
        warm[0] += 1
        if warm[0] == clients:
            started[0] = time.perf_counter()
            warmed.set()
        try:
            await warmed.wait()
            if period is None:
                while remaining[0] > 0:
                    remaining[0] -= 1
                    await one(client)
                return
            assert duration is not None
            # Spread the clients' phases over the period so the load is even.
            next_at = trio.current_time() + period * index / clients
            end = trio.current_time() + duration
            while next_at < end:
                await trio.sleep_until(next_at)
                await one(client)
                next_at += period
        finally:
            await client.aclose()

    start = time.perf_counter()
    with trio.move_on_after(PHASE_TIMEOUT) as scope:
        async with trio.open_nursery() as nursery:
            for index in range(clients):
                nursery.start_soon(worker, index)
    elapsed = time.perf_counter() - (started[0] or start)
    if scope.cancelled_caught:
        error("phase timeout")
    latencies.sort()
    return {
        "requests": attempts[0],
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": round(latencies[-1], 2) if latencies else None,
        "requests_per_s": round(len(latencies) / elapsed, 1) if elapsed > 0 else None,
        "body_bytes": sizes[-1] if sizes else None,
    }


async def phase(targets: list[tuple[str, str, str]], agent_pid: int, clients: int,
                **how: Any) -> dict[str, Any]:
    """Each ``(key, base URL, path)`` of ``targets`` in turn, driven as ``how`` says."""
    results: dict[str, Any] = {}
    for key, base, path in targets:
        cpu0, own0, t0 = cpu_seconds(agent_pid), time.process_time(), time.monotonic()
        result = await drive(base, path, clients, **how)
        seconds = time.monotonic() - t0
        agent_cpu = cpu_seconds(agent_pid) - cpu0
        result["agent_cpu_percent_of_core"] = round(100 * agent_cpu / seconds, 1)
        # Steadier than the flat-out latencies, which move with how the 2 cores are shared.
        result["agent_cpu_ms_per_request"] = round(1000 * agent_cpu / max(1, result["requests"]),
                                                   3)
        result["load_generator_cpu_percent_of_core"] = round(
            100 * (time.process_time() - own0) / seconds, 1)
        results[key] = result
        await trio.sleep(1.0)  # let the agent's backlog (if any) drain between endpoints
    return results


def targets(healthz_base: str | None, base: str) -> list[tuple[str, str, str]]:
    """What a mode drives: /healthz on the healthz port (when given; also on ``base``, for
    comparison), then the other endpoints on ``base``."""
    first = [("healthz", healthz_base, "/healthz"),
             ("healthz_on_quart", base, "/healthz")] if healthz_base else [
        ("healthz", base, "/healthz")]
    return first + [(KEYS[path], base, path) for path in ENDPOINTS if path != "/healthz"]


def verdicts(results: dict[str, Any]) -> dict[str, bool]:
    met = {}
    for key, target in TARGETS.items():
        figures = results[key.removesuffix("_p99_ms")]
        met[key] = figures["errors"] == 0 and figures["p99_ms"] <= target
    return met


# --- the run ----------------------------------------------------------------------------------


def agent_command(profile: Path | None) -> list[str]:
    """``python -m trio_kubelet``, under cProfile when profiling (deterministic, so the
    per-request functions' own times add up; pyinstrument's pstats output collapses them)."""
    if profile is None:
        return [sys.executable, "-m", "trio_kubelet"]
    return [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "trio_kubelet"]


def floor(args: argparse.Namespace, httpx: Any, server_name: str) -> dict[str, Any]:
    """``/healthz`` of ``bare_quart.py`` on ``server_name`` (``own`` or ``hypercorn``), flat out
    and paced, as the agent's runs drive it."""
    (port,) = free_ports(1)
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("bare_quart.py")),
                               str(port), server_name],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {}

    async def main() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=REQUEST_TIMEOUT) as client:
            for _ in range(100):
                try:
                    (await client.get("/healthz")).raise_for_status()
                    break
                except httpx.HTTPError:
                    await trio.sleep(0.1)
        result["flat"] = (await phase([("healthz", base, "/healthz")], server.pid, args.clients,
                                      total=args.requests))["healthz"]
        result["paced"] = (await phase([("healthz", base, "/healthz")], server.pid, args.clients,
                                       period=0.5, duration=args.paced))["healthz"]

    try:
        trio.run(main)
    finally:
        stop_process(server)
    return result


def run(args: argparse.Namespace, httpx: Any) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="tkb-http-", dir="/tmp"))
    manifests = workdir / "manifests"
    manifests.mkdir()
    for index in range(args.pods):
        name = f"http-{index:03d}"
        (manifests / f"{name}.yaml").write_text(sleep_pod_manifest(name, IMAGE, "http"))
    agent_log = workdir / "agent.log"
    port, read_only_port, healthz_port = free_ports(3)
    result: dict[str, Any] = {"bench": "http", "pods": args.pods, "runtime": "fake",
                              "clients": args.clients}
    try:
        with fake_runtime(workdir) as (endpoint, _runtime_proc):
            with agent_log.open("w") as log:
                agent = subprocess.Popen(
                    [*agent_command(args.profile),
                     "--pod-manifest-path", str(manifests),
                     "--container-runtime-endpoint", endpoint,
                     "--cgroups-per-qos=false",  # fake pods: no cgroups on the host
                     "--root-dir", str(workdir / "root"),
                     "--pod-logs-dir", str(workdir / "pod-logs"),
                     "--hostname-override", NODE, "--node-ip", "127.0.0.1",
                     "--address", "127.0.0.1", "--port", str(port),
                     "--read-only-port", str(read_only_port),
                     "--healthz-port", str(healthz_port),
                     "--authorization-mode", "AlwaysAllow", "--anonymous-auth=true"],
                    stdout=log, stderr=subprocess.STDOUT)
            try:
                http_base = f"http://127.0.0.1:{read_only_port}"
                https_base = f"https://127.0.0.1:{port}"
                healthz_base = f"http://127.0.0.1:{healthz_port}"

                async def main() -> None:
                    ready = await wait_ready(httpx, http_base, args.pods, agent,
                                             args.start_timeout, agent_log)
                    result["all_running_after_s"] = ready["all_running_after_s"]
                    result["summary_ready_after_s"] = ready["summary_ready_after_s"]
                    result.update(describe_summary(ready["summary"], "summary_at_ready_"))
                    await trio.sleep(args.settle)
                    result["paced"] = await phase(targets(healthz_base, http_base), agent.pid,
                                                  args.clients, period=0.5, duration=args.paced)
                    result["flat"] = await phase(targets(healthz_base, http_base), agent.pid,
                                                 args.clients, total=args.requests)
                    result["flat_https"] = await phase(targets(None, https_base), agent.pid,
                                                       args.clients, total=args.requests)
                    async with httpx.AsyncClient(base_url=http_base,
                                                 timeout=REQUEST_TIMEOUT) as client:
                        answer = await client.get("/stats/summary")
                    answer.raise_for_status()
                    result.update(describe_summary(answer.json(), "summary_at_end_"))

                trio.run(main)
                if agent.poll() is not None:
                    raise RuntimeError(f"the agent exited during the run ({agent.returncode})")
            finally:
                stop_process(agent)
    finally:
        text = agent_log.read_text(errors="replace") if agent_log.exists() else ""
        result["agent_log_warnings"] = sum(1 for line in text.splitlines()
                                           if line[:1] in ("W", "E"))
        if args.keep:
            result["workdir"] = str(workdir)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["targets"] = TARGETS
    result["targets_met"] = {mode: verdicts(result[mode])
                             for mode in ("flat", "flat_https", "paced")}
    result["errors_total"] = sum(figures["errors"] for mode in ("flat", "flat_https", "paced")
                                 for figures in result[mode].values())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=1000,
                        help="requests per endpoint in the flat modes")
    parser.add_argument("--paced", type=float, default=10.0,
                        help="seconds per endpoint in the paced mode (one request/client/0.5 s)")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--start-timeout", type=float, default=180.0)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--profile", type=Path,
                        help="run the agent under cProfile and write its pstats here "
                             "(slower: compare with unprofiled runs only)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"bench": "http", "skipped": "needs root"}))
        return
    try:
        import httpx
    except ImportError:
        print(json.dumps({"bench": "http", "skipped": "httpx not installed"}))
        return
    load_at_start = round(os.getloadavg()[0], 2)
    result = run(args, httpx)
    result["floor_bare_quart_healthz"] = floor(args, httpx, "own")
    result["floor_bare_quart_on_hypercorn_healthz"] = floor(args, httpx, "hypercorn")
    result["tree"] = tree_version()
    result["loadavg_1m_at_start"] = load_at_start
    result["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    result["python"] = platform.python_version()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Hollow nodes: many full agents in one trio process, each over its own in-memory fake runtime.

Kubernetes answers "how does the control plane behave with a thousand nodes?" with kubemark (a
Go process per simulated node, real kubelet code over fakes) or kwok (no kubelet at all). Here
each hollow node is the real agent (``agent.run_agent``: sources, sync loop, pod workers, status
manager, node status and Lease, events) with its own node name, `FakeRuntime` (commands run
as ``runtime/fake_commands.py`` says), status store and caches. What a real node would share
with nobody but costs per node here is shared: the parsed configuration, the machine facts, the
kubeconfig's credentials and TLS context (each node has its own API client, so its own
connections, QPS limit and metrics, as a real node's). Nothing touches the host: no cgroups, no OOM
watcher, no sampling, no volumes on disk, no HTTP servers unless asked; each node's pod logs
and certificates go to its own scratch directory.

On SIGINT/SIGTERM every agent stops, then (unless ``keep_nodes``) the Node objects are deleted,
so the cluster forgets the hollow nodes instead of seeing them go NotReady.
"""

from __future__ import annotations

import collections
import contextvars
import gc
import hashlib
import ipaddress
import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from trio_kubelet.agent import AgentHost, run_agent
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.errors import APIError, NotFound
from trio_kubelet.apiserver.kubeconfig import Connection, load_kubeconfig
from trio_kubelet.certificate.client import ClientCertificateManager
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.config import AgentOptions
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.node.lease import LEASE_NAMESPACE
from trio_kubelet.node.machine import read_machine_facts
from trio_kubelet.node.registration import MachineFacts
from trio_kubelet.runtime.fake import FakeRuntime, in_process_opener
from trio_kubelet.runtime.fake_commands import script_for

log = logging.getLogger("trio_kubelet.hollow")

# Node i's InternalIP is the (i+1)th address of NODE_NETWORK; its pods' IPs come from the ith
# /24 of POD_NETWORK (253 addresses, each given again only once its pod has stopped, as
# host-local IPAM does). Neither is routed anywhere.
NODE_NETWORK = ipaddress.IPv4Network("172.16.0.0/12")
POD_NETWORK = ipaddress.IPv4Network("10.64.0.0/10")
MAX_NODES = POD_NETWORK.num_addresses // 256
# Images every hollow runtime has without a pull (the sandbox image).
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"
# The clusterDNS hollow nodes give pods when the configuration names none (a fake sandbox's
# resolv.conf reaches nobody; without one each pod would get a MissingClusterDNS event).
CLUSTER_DNS = "10.0.0.10"
SUMMARY_PERIOD = 60.0  # seconds between the runner's summary lines
# Collector policy: hundreds of agents keep millions of long-lived objects that every full
# collection would walk (a quarter of the process's CPU at 200 nodes, 0.25 s pauses), so they are
# frozen once the nodes have started, and young collections run less often.
FREEZE_AFTER = 30.0  # seconds after the last node started
GC_THRESHOLDS = (50_000, 20, 100)
DEFAULT_START_RATE = 50.0
DELETE_CONCURRENCY = 20  # Node deletions in flight at exit
DELETE_TIMEOUT = 60.0

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"

NODE = contextvars.ContextVar("hollow_node", default="")


@dataclass(frozen=True)
class HollowOptions:
    """``trio-kubelet hollow``: ``base`` is parsed once and shared by every node; each node
    ``i`` is named ``name_prefix + str(i)`` and lives under ``scratch/<name>``."""

    base: AgentOptions
    nodes: int
    scratch: Path
    name_prefix: str = "hollow-"
    record_dir: Path | None = None
    port_base: int | None = None  # node i serves the kubelet API on port_base + i
    keep_nodes: bool = False
    # Nodes started per second (0: all at once). Nodes started together keep renewing their
    # Leases and statuses together, a burst every 10 s that made 6.5 % of renewals late at 500
    # nodes; started at 50/s none was (docs/scale.md).
    start_rate: float = DEFAULT_START_RATE


def node_name(options: HollowOptions, index: int) -> str:
    return f"{options.name_prefix}{index}"


def node_options(options: HollowOptions, index: int) -> AgentOptions:
    """Node ``index``'s options: the shared configuration with its own name, address and
    directories (and its own port when it serves)."""
    name = node_name(options, index)
    root = options.scratch / name
    update: dict[str, Any] = {"pod_logs_dir": str(root / "logs")}
    if options.port_base is not None:
        update["port"] = options.port_base + index
    return replace(
        options.base,
        node_name=name,
        node_ip=str(NODE_NETWORK.network_address + index + 1),
        root_dir=root,
        cert_dir=None,
        record=options.record_dir / f"{name}.jsonl" if options.record_dir else None,
        config=options.base.config.model_copy(update=update),
    )


def pod_network(index: int) -> str:
    """The /24 node ``index``'s fake runtime gives its pods addresses from."""
    return str(ipaddress.IPv4Network((int(POD_NETWORK.network_address) + 256 * index, 24)))


def hollow_machine(host: MachineFacts, name: str) -> MachineFacts:
    """The host's capacity and OS, with ids of the node's own (every Node says which it is)."""
    ident = hashlib.md5(f"hollow {name}".encode()).hexdigest()
    return replace(host, machine_id=ident, system_uuid=ident, boot_id=ident)


class RequestCounts:
    """API requests of all hollow nodes by method, for the summary line."""

    def __init__(self) -> None:
        self.total: collections.Counter[str] = collections.Counter()
        self.errors = 0

    def observe(self, host: str, method: str, code: int | None) -> None:
        self.total[method] += 1
        if code is None or code >= 500:
            self.errors += 1


@dataclass(frozen=True)
class _SharedAPI:
    """Opens each node's API client (`AgentHost.open_api`) with the kubeconfig parsed once and
    its TLS context shared; each client keeps its own small connection pool, because httpx's
    pool scans all its connections for every request (one pool of thousands of connections
    cost more CPU than everything else: docs/scale.md)."""

    connection: Connection
    counts: RequestCounts

    def open(
        self, options: AgentOptions, metrics: AgentMetrics, clock: TrioWallClock
    ) -> tuple[APIClient | None, ClientCertificateManager | None]:
        def observe(host: str, method: str, code: int | None) -> None:
            metrics.api_observer(host, method, code)
            self.counts.observe(host, method, code)

        config = options.config
        api = APIClient(
            self.connection,
            qps=config.kube_api_qps,
            burst=config.kube_api_burst,
            observer=observe,
        )
        return api, None


async def run_hollow(
    options: HollowOptions,
    *,
    machine: MachineFacts | None = None,
    signals: bool = True,
    task_status: trio.TaskStatus[dict[str, FakeRuntime]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``options.nodes`` hollow nodes until SIGINT/SIGTERM (``signals``) or cancellation.

    ``machine`` is what each Node reports about its machine (None: the host's, read once).
    Reports each node's fake runtime by name once every node has been started.
    """
    if not 0 < options.nodes <= MAX_NODES:
        raise ValueError(f"--nodes: must be between 1 and {MAX_NODES} (got {options.nodes})")
    if machine is None:
        options.scratch.mkdir(parents=True, exist_ok=True)
        machine = await trio.to_thread.run_sync(read_machine_facts, options.scratch)
    counts = RequestCounts()
    shared = _shared_api(options.base, counts)
    runtimes: dict[str, FakeRuntime] = {}
    try:
        async with trio.open_nursery() as top:
            if signals:
                top.start_soon(_stop_on_signal, top.cancel_scope)
            top.start_soon(_summarize, runtimes, counts)
            async with trio.open_nursery() as agents:
                for index in range(options.nodes):
                    name = node_name(options, index)
                    host = AgentHost(
                        open_runtime=in_process_opener(
                            runtimes.setdefault(name, _runtime(index)), wire=False),
                        open_api=shared.open if shared is not None else None,
                        machine=hollow_machine(machine, name),
                        host_resources=False,
                        serve=options.port_base is not None,
                        signals=False,
                    )
                    agents.start_soon(_run_node, node_options(options, index), host)
                    if options.start_rate > 0:
                        await trio.sleep(1 / options.start_rate)
                log.info("Started %d hollow nodes", options.nodes)
                task_status.started(runtimes)
    finally:
        with trio.CancelScope(shield=True):
            if shared is not None and not options.keep_nodes:
                await _delete_nodes(shared, options)


def _runtime(index: int) -> FakeRuntime:
    """A containerd-2-like fake (container events) whose containers do what their commands
    say, that has the sandbox image and pulls any other at once."""
    fake = FakeRuntime(
        TrioWallClock().now,
        event_stream=True,
        default_script=script_for,
        pod_network=pod_network(index),
    )
    fake.add_image(SANDBOX_IMAGE, pinned=True)
    return fake


async def _run_node(options: AgentOptions, host: AgentHost) -> None:
    NODE.set(options.node_name)  # this task's and its children's log lines name the node
    await run_agent(options, host=host)


def _shared_api(base: AgentOptions, counts: RequestCounts) -> _SharedAPI | None:
    """The kubeconfig, parsed once for every node (None: no --kubeconfig)."""
    if base.kubeconfig is None:
        return None
    return _SharedAPI(load_kubeconfig(base.kubeconfig), counts)


async def run_process(options: HollowOptions) -> None:
    """`run_hollow` as the whole process (``trio-kubelet hollow``): once the nodes have built
    their state, it is kept out of the collector's passes."""
    async with trio.open_nursery() as nursery:

        async def run_then_stop(
            *, task_status: trio.TaskStatus[dict[str, FakeRuntime]] = trio.TASK_STATUS_IGNORED
        ) -> None:
            await run_hollow(options, task_status=task_status)
            nursery.cancel_scope.cancel()  # stopped by a signal: do not wait to freeze

        await nursery.start(run_then_stop)
        await trio.sleep(FREEZE_AFTER)
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        log.info("Froze %d long-lived objects", gc.get_freeze_count())


async def _stop_on_signal(cancel_scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("Received %s, stopping the hollow nodes", signal.Signals(signum).name)
            cancel_scope.cancel()
            return


async def _summarize(runtimes: dict[str, FakeRuntime], counts: RequestCounts) -> None:
    """Every SUMMARY_PERIOD: nodes started, pods running, API requests in the period."""
    last = collections.Counter(counts.total)
    while True:
        await trio.sleep(SUMMARY_PERIOD)
        now = collections.Counter(counts.total)
        period = now - last
        last = now
        by_method = " ".join(f"{method}={n}" for method, n in sorted(period.items()))
        sandboxes = sum(fake.ready_sandboxes() for fake in runtimes.values())
        log.info(
            "Hollow nodes: %d started, %d pod sandboxes ready; API requests in the last %.0fs: "
            "%d (%s), failed so far: %d",
            len(runtimes), sandboxes, SUMMARY_PERIOD, sum(period.values()),
            by_method or "none", counts.errors,
        )


async def _delete_nodes(shared: _SharedAPI, options: HollowOptions) -> None:
    """Delete every hollow Node and its Lease, DELETE_CONCURRENCY at a time, for at most
    DELETE_TIMEOUT seconds. (The garbage collector would delete the Lease, owned by the Node,
    but only later: a runner started again meanwhile would adopt it, then see it deleted.)"""
    client = APIClient(shared.connection, qps=100, burst=100)
    limit = trio.Semaphore(DELETE_CONCURRENCY)
    deleted = 0

    async def delete(name: str) -> None:
        nonlocal deleted
        async with limit:
            for path in (f"/api/v1/nodes/{name}", f"{LEASES}/{name}"):
                try:
                    await client.delete(path)
                except NotFound:
                    pass
                except APIError as err:
                    log.warning("Could not delete %s: %s", path, err)
                    return
            deleted += 1

    with trio.move_on_after(DELETE_TIMEOUT) as timeout:
        async with trio.open_nursery() as nursery:
            for index in range(options.nodes):
                nursery.start_soon(delete, node_name(options, index))
    if timeout.cancelled_caught:
        log.warning("Gave up deleting hollow nodes after %.0fs", DELETE_TIMEOUT)
    log.info("Deleted %d hollow nodes", deleted)
    await client.aclose()


class NodeLogFilter(logging.Filter):
    """Prefixes each record's message with the hollow node it came from."""

    def filter(self, record: logging.LogRecord) -> bool:
        node = NODE.get()
        if node and isinstance(record.msg, str):
            record.msg = f"[{node}] {record.msg}"
        return True


@contextmanager
def node_log_prefix(handler: logging.Handler) -> Iterator[None]:
    """Log lines through ``handler`` name their hollow node while this is entered."""
    node_filter = NodeLogFilter()
    handler.addFilter(node_filter)
    try:
        yield
    finally:
        handler.removeFilter(node_filter)


"""Wiring the agent: connect to the runtime, start the sources and the sync loop in one nursery."""

from __future__ import annotations

import logging
import math
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from trio_kubelet import __version__
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import load_kubeconfig
from trio_kubelet.apiserver.object_cache import ObjectCache, PodObjects
from trio_kubelet.apiserver.services import ServiceCache
from trio_kubelet.apiserver.tokens import TokenSource
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.config import AgentOptions, ConfigError, KubeletConfiguration
from trio_kubelet.core.log_rotation import RotationPolicy
from trio_kubelet.core.observed import RuntimePodStatus
from trio_kubelet.core.pod_cgroups import KUBEPODS, cgroup_path, kubepods_config
from trio_kubelet.core.pod_dns import (
    CHECK_LIMITS_FOR_RESOLV_CONF,
    DNSSettings,
    ResolvConf,
    parse_resolv_conf,
    resolv_conf_problem,
)
from trio_kubelet.core.timestamps import format_time
from trio_kubelet.events import Event, ResyncTick
from trio_kubelet.heap import trim_heap_forever
from trio_kubelet.images.gc import ImageGC, image_gc_policy
from trio_kubelet.images.listing import NodeImages
from trio_kubelet.images.manager import ImageManager
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Pod
from trio_kubelet.model.quantity import parse_quantity
from trio_kubelet.node.kernel_tunables import kernel_default_errors, read_proc_sys
from trio_kubelet.node.lock_file import exit_on_contention, held_lock_file
from trio_kubelet.node.machine import read_machine_facts
from trio_kubelet.node.manager import NodeManager, NodePressure, RuntimeProbe
from trio_kubelet.node.registration import (
    Amount,
    MachineFacts,
    allocatable_reservation,
    configured_allocatable,
    machine_capacity,
)
from trio_kubelet.node.shutdown import NodeShutdownManager, ShutdownReports
from trio_kubelet.probes.manager import ProbeManager
from trio_kubelet.probes.prober import Prober
from trio_kubelet.probes.results import ProbeResults
from trio_kubelet.reconcile.container_gc import CONTAINER_GC_PERIOD, ContainerGC
from trio_kubelet.reconcile.container_setup import NodeFacts
from trio_kubelet.reconcile.log_rotation import LOG_MONITOR_PERIOD, ContainerLogRotation
from trio_kubelet.reconcile.loop import SyncLoop
from trio_kubelet.reconcile.start_order import StartOrder
from trio_kubelet.reconcile.stop_order import StopOrder
from trio_kubelet.reconcile.workers import WorkerContext
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.recording.records import Header
from trio_kubelet.resources.cgroups import CgroupError, QOSCgroups
from trio_kubelet.resources.eviction import EvictionConfig, EvictionManager, NodeReclaimers
from trio_kubelet.runtime.client import CRIClient, Observer, open_cri_client
from trio_kubelet.runtime.errors import CRIError
from trio_kubelet.server.health import pleg_error
from trio_kubelet.server.listeners import Listeners, bound_servers
from trio_kubelet.sources.apiserver import API_SOURCE, APIPods, run_api_source
from trio_kubelet.sources.manifest_url import SOURCE as URL_SOURCE
from trio_kubelet.sources.manifest_url import run_manifest_url
from trio_kubelet.sources.oom import OOMWatcher
from trio_kubelet.sources.pleg import run_pleg
from trio_kubelet.sources.sampler import Sampler
from trio_kubelet.sources.static_files import run_static_files
from trio_kubelet.sources.supervise import supervise
from trio_kubelet.sources.volume_stats import VolumeStats
from trio_kubelet.status.manager import StatusManager
from trio_kubelet.status.mirror import MirrorPods
from trio_kubelet.status.store import PodStatusStore
from trio_kubelet.volumes import VolumeManager
from trio_kubelet.watch import print_pod_changes

if TYPE_CHECKING:
    # Imported where used: the certificate managers only with an API server, the server
    # stack (Quart, hypercorn, and cryptography with a client CA: ~0.2 s of CPU, a fifth of
    # the agent's import) once the pods are on their way, so that they start that much sooner.
    from trio_kubelet.certificate.client import ClientCertificateManager
    from trio_kubelet.certificate.serving import ServingCertificateManager
    from trio_kubelet.server.serve import ServerAddresses
    from trio_kubelet.server.view import NodeView

log = logging.getLogger("trio_kubelet.agent")

# The sources' channel is bounded like the Go PLEG's; a full channel applies
# backpressure to the sources instead of dropping events.
EVENT_CHANNEL_SIZE = 1000
RUNTIME_RETRY_MAX = 30.0
# How long the pod sources wait for the PLEG's first relist (milliseconds on a sound runtime).
FIRST_RELIST_WAIT = 5.0
# How often the sampler reads cgroups (cAdvisor's housekeeping; the sampler's figures
# feed /stats/summary and /metrics/cadvisor).
HOUSEKEEPING_INTERVAL = 10.0
# How often the eviction manager compares the latest sample with its thresholds (Go's
# evictionMonitoringPeriod).
EVICTION_MONITORING_INTERVAL = 10.0

RuntimeOpener = Callable[..., AbstractAsyncContextManager[CRIClient]]
APIOpener = Callable[
    [AgentOptions, AgentMetrics, TrioWallClock],
    "tuple[APIClient | None, ClientCertificateManager | None]",
]


@dataclass(frozen=True)
class AgentHost:
    """What the agent takes from the machine and process it runs in. The defaults are a real
    node's; a hollow node (hollow.py) runs many agents in one process over stand-ins.

    ``open_runtime``/``open_api`` (None: `open_cri_client`, `open_api_client`) open the CRI
    and API-server clients; ``machine`` is the Node's machine (None: read the host);
    ``host_resources`` False leaves the host alone: no QoS cgroups, no OOM watcher, no
    cgroup/filesystem sampling, eviction, image GC or container log rotation, no pod volumes
    on disk, no systemd-logind; ``serve`` runs the kubelet's HTTP servers; ``signals`` handles
    SIGINT/SIGTERM (else the caller cancels).
    """

    open_runtime: RuntimeOpener | None = None
    open_api: APIOpener | None = None
    machine: MachineFacts | None = None
    host_resources: bool = True
    serve: bool = True
    signals: bool = True


REAL_HOST = AgentHost()


def _node_facts(
    options: AgentOptions, events: EventRecorder, capacity: dict[str, Amount]
) -> NodeFacts:
    """The node's allocatable resources and --node-ip, as containers' environments read them,
    and the DNS settings pods get.

    The host IPs are the ones pod statuses report as hostIP(s), so env and status agree.
    """
    config = options.config
    allocatable = configured_allocatable(capacity, config)
    host_ips = [ip for ip in (options.node_ip or "").split(",") if ip]
    return NodeFacts(
        host_ips=host_ips,
        allocatable={name: a.value for name, a in allocatable.items()},
        dns=DNSSettings(
            cluster_dns=tuple(config.cluster_dns),
            cluster_domain=config.cluster_domain,
            resolv_conf=config.resolv_conf,
            host=_host_resolv_conf(options, events),
            node_ips=tuple(host_ips),
        ),
    )


# The Go kubelet refuses to read a larger resolv.conf.
RESOLV_CONF_MAX_BYTES = 10 * 2**20


def _host_resolv_conf(options: AgentOptions, events: EventRecorder) -> ResolvConf:
    """The node's resolv.conf (resolvConf), parsed once; problems are node Warning events.

    A file that cannot be read leaves pods without the node's servers and search paths
    (the Go kubelet instead fails every such pod's sandbox until it can be read).
    """
    path = options.config.resolv_conf
    if not path:
        return ResolvConf()
    host = ResolvConf()
    try:
        with open(path, "rb") as file:
            data = file.read(RESOLV_CONF_MAX_BYTES + 1)
    except OSError as err:
        problems = [f"cannot read resolv.conf file {path!r}: {err.strerror or err}"]
    else:
        if len(data) > RESOLV_CONF_MAX_BYTES:
            problems = [f"resolv.conf file {path!r} is larger than {RESOLV_CONF_MAX_BYTES} bytes"]
        else:
            host, problems = parse_resolv_conf(data.decode("utf-8", "replace"))
            problems = [f"resolv.conf file {path!r}: {problem}" for problem in problems]
            limits = resolv_conf_problem(host, path, options.config.cluster_domain)
            problems += [limits] if limits else []
    for problem in problems:
        log.warning("Pod DNS: %s", problem)
        events.node_event(options.node_name, "Warning", CHECK_LIMITS_FOR_RESOLV_CONF, problem)
    return host


def kubepods_limits(options: AgentOptions, capacity: dict[str, Amount]) -> dict[str, Amount]:
    """What the kubepods cgroup is held to (Go's enforceNodeAllocatableCgroups).

    With enforceNodeAllocatable containing "pods": capacity less kubeReserved and
    systemReserved (not less the eviction thresholds: eviction keeps that margin);
    otherwise the whole capacity, so kubepods never has the kernel's low default shares.
    """
    config = options.config
    if not config.cgroups_per_qos or "pods" not in config.enforce_node_allocatable:
        return capacity
    reserved = allocatable_reservation(
        capacity,
        kube_reserved=config.kube_reserved,
        system_reserved=config.system_reserved,
        eviction_hard={},
    )
    return {
        name: Amount(max(Fraction(0), a.value - reserved.get(name, Fraction(0))), a.binary)
        for name, a in capacity.items()
    }


async def _start_qos_cgroups(
    options: AgentOptions, limits: dict[str, Amount]
) -> QOSCgroups | None:
    """The kubepods hierarchy (cgroupsPerQOS); without usable cgroups, pods run without it."""
    config = options.config
    if not config.cgroups_per_qos:
        return None
    kubepods = kubepods_config({name: str(amount) for name, amount in limits.items()})
    qos = QOSCgroups(cgroup_root=config.cgroup_root, kubepods=kubepods,
                     pod_pids_limit=config.pod_pids_limit)
    try:
        await qos.start()  # no pod is active yet: the sync loop does not exist
    except CgroupError as err:
        log.error("QoS cgroups unavailable, pods get the runtime's default cgroups: %s", err)
        return None
    log.info("QoS cgroups ready on cgroup %s", qos.mode.value)
    return qos


async def wait_for_runtime(client: CRIClient, endpoint: str) -> str:
    """Ask the runtime for its version until it answers, backing off 1 s → 30 s between tries."""
    delay = 1.0
    while True:
        try:
            version = await client.version()
        except CRIError as err:
            log.error(
                "Container runtime at %s is not reachable (%s); retrying in %.0fs",
                endpoint,
                err,
                delay,
            )
            await trio.sleep(delay)
            delay = min(delay * 2, RUNTIME_RETRY_MAX)
            continue
        return f"{version.runtime_name} {version.runtime_version}"


async def _resync(send: trio.MemorySendChannel[Event], period: float) -> None:
    async with send:
        while True:
            await trio.sleep(period)
            await send.send(ResyncTick())


async def _stop_on_signal(
    cancel_scope: trio.CancelScope, node_shutdown: trio.Event, shutdown: NodeShutdownManager
) -> None:
    """SIGINT, or SIGTERM where it does not shut the node down: stop the agent, pods keep
    running. SIGTERM where it does (graceful shutdown on, and no logind to say when): set
    ``node_shutdown`` so the node is shut down first; a second signal stops now."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            first_term = shutdown.sigterm_shuts_down and not node_shutdown.is_set()
            if signum == signal.SIGTERM and first_term:
                log.info("Received %s: graceful node shutdown", name)
                node_shutdown.set()
                continue
            log.info("Received %s, shutting down (pods keep running)", name)
            cancel_scope.cancel()
            return


async def _shut_down_node(
    requested: trio.Event, shutdown: NodeShutdownManager, deps: Deps, loop: SyncLoop,
    cancel_scope: trio.CancelScope,
) -> None:
    """Once SIGTERM asked for it: stop the pods as the node shutdown says (and let the
    cluster side report), then the agent."""
    await requested.wait()
    async with deps.send.clone() as send:
        await shutdown.shut_down(loop, deps.store.is_stopped, send.send)
    cancel_scope.cancel()


async def _watch_logind(shutdown: NodeShutdownManager, deps: Deps, loop: SyncLoop) -> None:
    """The node's shutdown signal from systemd-logind, where the host has one."""
    async with deps.send.clone() as send:
        await shutdown.watch_logind(loop, deps.store.is_stopped, send.send)


async def _final_shutdown_reports(node: NodeManager, statuses: StatusManager) -> None:
    """Once a node shutdown has stopped the pods: their final statuses, then the node's."""
    await statuses.sync_all()
    await node.sync_status()


def pod_sources(options: AgentOptions) -> list[str]:
    """The pod sources this configuration enables (each must report before orphans go)."""
    sources = ["file"] if options.config.static_pod_path else []
    if options.config.static_pod_url:
        sources.append(URL_SOURCE)
    if options.kubeconfig is not None:
        sources.append(API_SOURCE)
    return sources


def open_api_client(
    options: AgentOptions, metrics: AgentMetrics, clock: TrioWallClock
) -> tuple[APIClient | None, ClientCertificateManager | None]:
    """The API-server client ``--kubeconfig`` asks for, and the manager of its client
    certificate when it comes from the cluster (--bootstrap-kubeconfig, rotateCertificates);
    raises KubeconfigError if there are no usable credentials."""
    if options.kubeconfig is None:
        return None, None
    from trio_kubelet.certificate.client import ClientCertificateManager, client_credentials
    from trio_kubelet.certificate.rotation import wall_time

    config = options.config
    managed = options.bootstrap_kubeconfig is not None or config.rotate_certificates
    if managed:
        credentials = client_credentials(options, wall_time(clock.now))
        connection = credentials.connection
    else:
        connection = load_kubeconfig(options.kubeconfig)
    log.info("Using API server %s (kubeconfig %s)", connection.server, options.kubeconfig)
    api = APIClient(
        connection,
        qps=config.kube_api_qps,
        burst=config.kube_api_burst,
        observer=metrics.api_observer,
    )
    if not managed:
        return api, None
    return api, ClientCertificateManager(options, credentials, api, clock=clock.now)


async def _once_ready(ready: trio.Event, start: Callable[[], Awaitable[None]]) -> None:
    """Run ``start`` once the client certificate is in use (after a TLS bootstrap)."""
    await ready.wait()
    await start()


@dataclass(frozen=True)
class Deps:
    """What every subsystem is built from: the settings, time, the agent's shared outputs
    (metrics, Kubernetes events, pod statuses, the recording), the runtime, the sync loop's
    channel (builders clone it; every input of the loop arrives on it), and what the agent
    may take from its host (a hollow node leaves the host's resources alone)."""

    options: AgentOptions
    clock: TrioWallClock
    metrics: AgentMetrics
    events: EventRecorder
    store: PodStatusStore
    recorder: Recorder | None
    client: CRIClient
    send: trio.MemorySendChannel[Event]
    host: AgentHost

    @property
    def config(self) -> KubeletConfiguration:
        return self.options.config


@dataclass(frozen=True)
class ClusterObjects:
    """The API objects pods refer to (ConfigMaps, Secrets, Services) and their tokens; built
    with the API client, listed once the cluster side runs."""

    config_maps: ObjectCache
    secrets: ObjectCache
    services: ServiceCache
    pods: PodObjects
    tokens: TokenSource

    @classmethod
    def of(cls, api: APIClient, clock: TrioWallClock) -> ClusterObjects:
        config_maps, secrets = ObjectCache(api, "configmaps"), ObjectCache(api, "secrets")
        services = ServiceCache(api)  # every Service, for containers' link variables
        pods = PodObjects(config_maps, secrets, services)
        return cls(config_maps, secrets, services, pods, TokenSource(api, clock.now))


@dataclass(frozen=True)
class Images:
    gc: ImageGC
    manager: ImageManager


@dataclass(frozen=True)
class NodeStats:
    volumes: VolumeStats
    sampler: Sampler
    oom: OOMWatcher


async def run_images(nursery: trio.Nursery, deps: Deps) -> Images:
    """One image manager for every pod worker (the node-wide pull limit); image GC learns
    from it which images containers are about to use."""
    config = deps.config
    gc = ImageGC(deps.client, image_gc_policy(config), node_name=deps.options.node_name,
                 events=deps.events, metrics=deps.metrics, recorder=deps.recorder)
    manager = ImageManager(deps.client, deps.events, serialize_pulls=config.serialize_image_pulls,
                           max_parallel_pulls=config.max_parallel_image_pulls,
                           pull_timeout=config.runtime_request_timeout or None,
                           registry_qps=config.registry_pull_qps,
                           registry_burst=config.registry_burst,
                           metrics=deps.metrics, on_image_used=gc.note_used)
    if deps.host.host_resources:
        await nursery.start(gc.run)
    return Images(gc, manager)


async def run_probes(nursery: trio.Nursery, deps: Deps) -> ProbeManager:
    """Probe workers; their results reach the sync loop as ProbeResultEvents."""
    probes = ProbeManager(Prober(deps.client), deps.store, deps.send.clone(),
                          wall_clock=deps.clock.now, events=deps.events, metrics=deps.metrics)
    await nursery.start(probes.run)
    return probes


def worker_context(
    deps: Deps, runtime: str, images: Images, probes: ProbeManager, qos: QOSCgroups | None,
    objects: ClusterObjects | None, capacity: dict[str, Amount],
) -> WorkerContext:
    """What every pod worker shares, every field set here."""
    options = deps.options
    return WorkerContext(
        client=deps.client, images=images.manager, store=deps.store, clock=deps.clock,
        pod_logs_dir=Path(deps.config.pod_logs_dir),
        node_ip=(options.node_ip or "").split(",")[0], runtime_name=runtime.split()[0],
        recorder=deps.recorder, events=deps.events, probe_results=ProbeResults(),
        objects=objects.pods if objects else None, qos=qos,
        volumes=(VolumeManager(options.root_dir / "pods", events=deps.events)
                 if deps.host.host_resources else None),
        tokens=objects.tokens if objects else None,
        node=_node_facts(options, deps.events, capacity), stop_order=StopOrder(),
        start_order=StartOrder(cpus=math.ceil(capacity["cpu"].value)),
        on_status=probes.status_changed,
    )


async def run_sync_loop(
    nursery: trio.Nursery, deps: Deps, ctx: WorkerContext, probes: ProbeManager,
    receive: trio.MemoryReceiveChannel[Event],
) -> SyncLoop:
    config = deps.config
    loop = SyncLoop(ctx, pod_sources(deps.options), sync_frequency=config.sync_frequency,
                    probes=probes, allowed_unsafe_sysctls=config.allowed_unsafe_sysctls)
    await nursery.start(loop.run, receive)
    return loop


async def run_container_gc(
    nursery: trio.Nursery, deps: Deps, loop: SyncLoop, qos: QOSCgroups | None
) -> ContainerGC:
    """Dead containers, empty sandboxes, log directories and cgroups of gone pods."""
    gc = ContainerGC(deps.client, deps.options.container_gc, existing_pods=loop.existing_pods,
                     sources_ready=lambda: loop.config.sources_ready,
                     pod_logs_dir=Path(deps.config.pod_logs_dir), clock=deps.clock.now,
                     period=CONTAINER_GC_PERIOD, qos=qos, recorder=deps.recorder)
    await nursery.start(gc.run)
    return gc


async def run_log_rotation(nursery: trio.Nursery, deps: Deps) -> None:
    """Running containers' logs rotated at containerLogMaxSize, containerLogMaxFiles kept."""
    config = deps.config
    policy = RotationPolicy(max_size=int(parse_quantity(config.container_log_max_size)),
                            max_files=config.container_log_max_files)
    rotation = ContainerLogRotation(deps.client, policy, pod_logs_dir=Path(config.pod_logs_dir),
                                    clock=deps.clock.now, period=LOG_MONITOR_PERIOD,
                                    recorder=deps.recorder)
    await nursery.start(rotation.run)


async def run_node_stats(nursery: trio.Nursery, deps: Deps) -> NodeStats:
    """The sampler (cgroups, /proc, statvfs), pod volume figures and the OOM watcher."""
    options, config = deps.options, deps.config
    volumes = VolumeStats(options.root_dir / "pods", period=config.volume_stats_agg_period)
    sampler = Sampler(
        root_fs=options.root_dir if options.root_dir.exists() else Path("/"),
        pod_logs_dir=Path(config.pod_logs_dir), wall_clock=deps.clock.now,
        volumes=volumes.latest,
        pods_cgroup=(cgroup_path((KUBEPODS,), config.cgroup_root)
                     if config.cgroups_per_qos else None),
        qos_root=config.cgroup_root,
    )
    oom = OOMWatcher(on_counts=sampler.set_oom_counts, wall_clock=deps.clock.now,
                     qos_root=config.cgroup_root)
    if deps.host.host_resources:
        await nursery.start(oom.run, deps.send.clone())
        await nursery.start(volumes.run)
        nursery.start_soon(partial(sampler.run, deps.client, interval=HOUSEKEEPING_INTERVAL))
    return NodeStats(volumes, sampler, oom)


async def run_eviction(
    nursery: trio.Nursery, deps: Deps, config: EvictionConfig, loop: SyncLoop,
    stats: NodeStats, reclaimer: NodeReclaimers,
) -> EvictionManager:
    """The eviction manager: its conditions and evictions go to the sync loop as events."""
    eviction = EvictionManager(
        config, loop, lambda: stats.sampler.latest, deps.send.clone().send,
        wall_clock=deps.clock.now, stopped=deps.store.is_stopped, events=deps.events,
        metrics=deps.metrics, reclaimer=reclaimer, recorder=deps.recorder,
    )
    if deps.host.host_resources:
        await nursery.start(eviction.run)
    return eviction


async def run_pod_sources(nursery: trio.Nursery, deps: Deps) -> None:
    """The static pod sources: the manifest directory and the manifest URL."""
    options, config = deps.options, deps.config
    if config.static_pod_path:
        static_files = partial(
            run_static_files, path=Path(config.static_pod_path), node_name=options.node_name,
            check_frequency=config.file_check_frequency, wall_clock=deps.clock.now,
        )
        await nursery.start(supervise, "file", static_files, deps.send.clone())
    if config.static_pod_url:
        manifest_url = partial(
            run_manifest_url, url=config.static_pod_url, headers=config.static_pod_url_header,
            node_name=options.node_name, check_frequency=config.http_check_frequency,
            wall_clock=deps.clock.now,
        )
        await nursery.start(supervise, "http", manifest_url, deps.send.clone())


async def run_runtime_sources(nursery: trio.Nursery, deps: Deps, stats: NodeStats) -> None:
    """The PLEG (the runtime's event stream unless the EventedPLEG gate is false: Go's gate
    is off by default; docs/architecture.md says why ours is on) and the resync ticks;
    returns once the PLEG has listed the runtime, or `FIRST_RELIST_WAIT` later (a runtime
    that cannot be listed, or a PLEG that fails, must not hold the pod sources back)."""
    config = deps.config
    listed = trio.Event()
    oom_update = stats.oom.update if deps.host.host_resources else None

    def relisted(pods: Mapping[str, RuntimePodStatus]) -> None:
        listed.set()
        if oom_update is not None:
            oom_update(pods)

    pleg = partial(run_pleg, client=deps.client, metrics=(deps.metrics, deps.clock.now),
                   on_relist=relisted,
                   container_events=config.feature_gates.get("EventedPLEG", True))
    nursery.start_soon(supervise, "pleg", pleg, deps.send.clone())
    nursery.start_soon(_resync, deps.send.clone(), config.sync_frequency)
    with trio.move_on_after(FIRST_RELIST_WAIT):
        await listed.wait()


async def run_cluster(
    nursery: trio.Nursery, deps: Deps, api: APIClient, objects: ClusterObjects,
    loop: SyncLoop, shutdown: NodeShutdownManager, pressure: NodePressure,
    machine: MachineFacts,
) -> None:
    """The API-server side: the Node and its Lease, pod source, referenced objects and
    Services, pod statuses, mirror pods. ``machine`` is what the Node reports of its host."""
    options = deps.options
    probe = RuntimeProbe(deps.client)
    await probe.probe()  # the first answer, before the first node status
    nursery.start_soon(probe.run)
    started = trio.current_time()
    health = probe.health(
        lambda: pleg_error(trio.current_time(), loop.last_relist_ok, started), pressure
    )
    images = NodeImages(deps.client)  # status.images
    await nursery.start(images.run)
    health = replace(health, shutdown_error=shutdown.shutdown_error, images=lambda: images.latest)
    node = NodeManager(api, options, health, deps.clock, machine=machine, events=deps.events)
    await nursery.start(node.run)
    for cache in (objects.config_maps, objects.secrets, objects.services):
        await nursery.start(cache.run)
    pods = APIPods(caches=(objects.config_maps, objects.secrets))
    api_source = partial(run_api_source, client=api, node_name=options.node_name, state=pods)
    nursery.start_soon(supervise, "api", api_source, deps.send.clone())
    mirrors = MirrorPods(api, pods, options.node_name, partial(_static_pods, options, loop),
                         lambda: node.node_uid, deps.store.next_change)
    nursery.start_soon(mirrors.run)
    statuses = StatusManager(api, deps.store, pods, mirror_of=mirrors.mirror_of,
                             wall_time=lambda: format_time(deps.clock.now()))
    nursery.start_soon(statuses.run)
    shutdown.reports = ShutdownReports(node.sync_soon,
                                       partial(_final_shutdown_reports, node, statuses))


def _static_pods(options: AgentOptions, loop: SyncLoop) -> dict[str, Pod] | None:
    """The file and URL sources' pods, once every one of them has reported."""
    sets = loop.config.pod_sets()
    merged: dict[str, Pod] = {}
    for source in pod_sources(options):
        if source != API_SOURCE:
            if source not in sets:
                return None
            merged.update(sets[source])
    return merged


def _recorder(options: AgentOptions, clock: TrioWallClock) -> Recorder | None:
    """``--record FILE``: its header now; it writes once the sync loop can give snapshots."""
    if options.record is None:
        return None
    header = Header(
        t=trio.current_time(),
        agent_version=__version__,
        node=options.node_name,
        start_time=clock.now(),
        config=options.config.to_wire(),
        sources=pod_sources(options),
    )
    log.info("Recording to %s", options.record)
    return Recorder(options.record, header, max_bytes=options.record_max_bytes)


def _eviction_config(
    config: KubeletConfiguration, pods_limits: dict[str, Amount]
) -> EvictionConfig:
    """The eviction settings; a threshold that cannot be used is a configuration error."""
    pods_memory = pods_limits.get("memory")
    return EvictionConfig.from_config(
        config,
        pods_memory_limit=int(pods_memory.value) if pods_memory else None,
        monitoring_interval=EVICTION_MONITORING_INTERVAL,
    )


def _start_certificates(
    top: trio.Nursery, options: AgentOptions, api: APIClient | None,
    certificates: ClientCertificateManager | None, ready: trio.Event, clock: TrioWallClock,
) -> ServingCertificateManager | None:
    """Client certificate rotation, and the serving certificate from the cluster if asked."""
    if certificates is not None:
        top.start_soon(certificates.run)
    if api is None or not options.config.server_tls_bootstrap:
        return None
    from trio_kubelet.certificate.serving import ServingCertificateManager, node_addresses

    serving = ServingCertificateManager(
        options, api, partial(node_addresses, options), clock=clock.now
    )
    top.start_soon(_once_ready, ready, serving.run)
    return serving


def _observers(*observers: Observer | None) -> Observer | None:
    chosen = [o for o in observers if o is not None]
    if len(chosen) <= 1:
        return chosen[0] if chosen else None

    def observe(method: str, request: Any, outcome: Any, duration: float) -> None:
        for observer in chosen:
            observer(method, request, outcome, duration)

    return observe


async def _serve(
    view: NodeView,
    metrics: AgentMetrics,
    api: APIClient | None,
    serving: ServingCertificateManager | None,
    listeners: dict[str, Listeners] | None,
    *,
    task_status: trio.TaskStatus[ServerAddresses] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The kubelet API (10250), read-only (10255, if on) and healthz (10248) servers."""
    from trio_kubelet.server.auth import ReviewClient
    from trio_kubelet.server.routes_logs import logs_blueprint
    from trio_kubelet.server.routes_node import node_blueprints
    from trio_kubelet.server.routes_stats import stats_blueprint
    from trio_kubelet.server.routes_streaming import streaming_blueprint
    from trio_kubelet.server.serve import run_servers

    node = node_blueprints(view, metrics)
    stats = stats_blueprint(view)
    full = [*node.full, stats, logs_blueprint(view), streaming_blueprint(view)]
    read_only = [*node.read_only, stats]
    review = ReviewClient(api.http) if api is not None else None
    await run_servers(
        view, full, read_only, metrics=metrics, review=review,
        serving=serving.context if serving is not None else None, listeners=listeners,
        task_status=task_status,
    )


async def run_server(
    nursery: trio.Nursery, deps: Deps, loop: SyncLoop, stats: NodeStats, start: Startup
) -> None:
    """The HTTP servers over a read-only view of the node."""
    from trio_kubelet.server.view import NodeView

    view = NodeView(
        options=deps.options, store=deps.store, client=deps.client,
        last_relist=lambda: loop.last_relist_ok, last_sync_loop=lambda: loop.last_handled,
        latest_sample=lambda: stats.sampler.latest, pod_logs_dir=Path(deps.config.pod_logs_dir),
    )
    await nursery.start(partial(_serve, view, deps.metrics, start.api, start.serving,
                                start.listeners))


@dataclass(frozen=True)
class Startup:
    """What ``run_agent`` settles before the runtime answers: the node's figures, the
    cluster side's connection and credentials, and the graceful node shutdown."""

    machine: MachineFacts
    capacity: dict[str, Amount]
    pods_limits: dict[str, Amount]
    eviction: EvictionConfig
    api: APIClient | None
    objects: ClusterObjects | None
    credentials: trio.Event  # set once the API client's certificate is in use
    serving: ServingCertificateManager | None
    shutdown: NodeShutdownManager
    node_shutdown: trio.Event  # set by SIGTERM where it shuts the node down
    listeners: dict[str, Listeners] | None  # the servers' sockets, bound at the start


async def run_node(
    nursery: trio.Nursery, top: trio.Nursery, deps: Deps, start: Startup, runtime: str,
    receive: trio.MemoryReceiveChannel[Event],
) -> SyncLoop:
    """Every subsystem of a node whose runtime answers, built once, in dependency order."""
    qos = (await _start_qos_cgroups(deps.options, start.pods_limits)
           if deps.host.host_resources else None)
    images = await run_images(nursery, deps)
    probes = await run_probes(nursery, deps)
    ctx = worker_context(deps, runtime, images, probes, qos, start.objects, start.capacity)
    loop = await run_sync_loop(nursery, deps, ctx, probes, receive)
    if qos is not None:
        nursery.start_soon(qos.repair, loop.node_pods)
    if deps.recorder is not None:
        await top.start(deps.recorder.run, loop.snapshot)
    if start.shutdown.enabled:
        nursery.start_soon(_shut_down_node, start.node_shutdown, start.shutdown, deps, loop,
                           top.cancel_scope)
        if deps.host.host_resources:  # a hollow node has no logind of its own
            nursery.start_soon(_watch_logind, start.shutdown, deps, loop)
    if deps.host.host_resources:  # process-wide: one hollow process runs many nodes
        nursery.start_soon(trim_heap_forever)
    container_gc = await run_container_gc(nursery, deps, loop, qos)
    if deps.host.host_resources:  # a hollow node's fake runtime writes no container output
        await run_log_rotation(nursery, deps)
    stats = await run_node_stats(nursery, deps)
    eviction = await run_eviction(nursery, deps, start.eviction, loop, stats,
                                  NodeReclaimers(container_gc, images.gc))
    # The runtime is listed before the first pods come: their workers then know which
    # pods it cannot hold (`PodWorker.known_absent`).
    await run_runtime_sources(nursery, deps, stats)
    await run_pod_sources(nursery, deps)
    if start.api is not None and start.objects is not None:
        # Static pods do not wait for a TLS bootstrap (the node's own API server may be one
        # of them): the cluster side starts once it is done.
        cluster = partial(run_cluster, nursery, deps, start.api, start.objects, loop,
                          start.shutdown, eviction, start.machine)
        await _run_once_ready(nursery, start.credentials, cluster)
    if deps.host.serve:
        await run_server(nursery, deps, loop, stats, start)
    if deps.options.show_pods:
        nursery.start_soon(print_pod_changes, deps.store, sys.stdout, deps.clock)
    return loop


async def run_agent(
    options: AgentOptions,
    *,
    store: PodStatusStore | None = None,
    cri_observer: Observer | None = None,
    host: AgentHost = REAL_HOST,
    task_status: trio.TaskStatus[SyncLoop] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the node agent until SIGINT/SIGTERM (or cancellation). Pods outlive the agent.

    ``store`` and ``cri_observer`` let tests and benchmarks watch the agent from inside the
    same process; ``host`` says what it may take from the machine (hollow nodes: a fake
    runtime, given machine facts, the host's resources left alone).
    """
    config = options.config
    log.info("trio-kubelet %s starting on node %s", __version__, options.node_name)
    # Read once at start-up, on the event loop (a few small files; a thread would stall
    # MockClock recordings).
    machine = host.machine if host.machine is not None else read_machine_facts(options.root_dir)
    capacity = machine_capacity(machine, config.max_pods)
    pods_limits = kubepods_limits(options, capacity)
    eviction_config = _eviction_config(config, pods_limits)  # before anything starts
    protected = config.protect_kernel_defaults and host.host_resources
    if protected and (errors := kernel_default_errors(read_proc_sys)):
        raise ConfigError(f"protectKernelDefaults: {'; '.join(errors)}")
    clock, metrics = TrioWallClock(), AgentMetrics(options.node_name)
    recorder = _recorder(options, clock)
    api, certificates = (host.open_api or open_api_client)(options, metrics, clock)
    events = EventRecorder(options.node_name, api, clock=clock.now)
    credentials = certificates.ready if certificates is not None else _set(trio.Event())
    send, receive = trio.open_memory_channel[Event](EVENT_CHANNEL_SIZE)
    async with (
        held_lock_file(options.lock_file),
        bound_servers(config, host.serve) as listeners,
        trio.open_nursery() as top,
    ):
        if options.exit_on_lock_contention and options.lock_file is not None:
            top.start_soon(exit_on_contention, options.lock_file, top.cancel_scope)
        shutdown = NodeShutdownManager(config, options.node_name, events=events)
        node_shutdown = trio.Event()
        if host.signals:
            top.start_soon(_stop_on_signal, top.cancel_scope, node_shutdown, shutdown)
        serving = _start_certificates(top, options, api, certificates, credentials, clock)
        # Events wait in the recorder's queue until the API server knows who we are.
        top.start_soon(_once_ready, credentials, events.run)
        start = Startup(machine, capacity, pods_limits, eviction_config, api,
                        ClusterObjects.of(api, clock) if api is not None else None,
                        credentials, serving, shutdown, node_shutdown, listeners)
        observer = _observers(cri_observer, metrics.cri_observer,
                              recorder.cri_observer if recorder else None)
        endpoint = config.container_runtime_endpoint
        async with (host.open_runtime or open_cri_client)(
            endpoint, timeout=config.runtime_request_timeout, observer=observer
        ) as client:
            runtime = await wait_for_runtime(client, endpoint)
            log.info("Connected to container runtime %s at %s", runtime, endpoint)
            deps = Deps(options, clock, metrics, events, store or PodStatusStore(), recorder,
                        client, send, host)
            async with trio.open_nursery() as nursery:
                task_status.started(await run_node(nursery, top, deps, start, runtime, receive))
        top.cancel_scope.cancel()
    if api is not None:
        await api.aclose()


def _set(event: trio.Event) -> trio.Event:
    event.set()
    return event


async def _run_once_ready(
    nursery: trio.Nursery, ready: trio.Event, start: Callable[[], Awaitable[None]]
) -> None:
    """``start`` now if ``ready`` is set, else in the background once it is."""
    if ready.is_set():
        await start()
    else:
        nursery.start_soon(_once_ready, ready, start)

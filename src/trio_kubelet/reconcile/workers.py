"""Pod workers: one task per pod that syncs it serially and carries out the decisions.

A worker is woken (coalesced: at most one pending wake-up) by the sync loop;
each sync inspects the runtime, asks ``compute_pod_actions`` what to do, does it
in the Go kubelet's SyncPod order, and publishes the pod's API status.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import trio

from trio_kubelet.apiserver.object_cache import PodObjects
from trio_kubelet.apiserver.tokens import TokenSource
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.core.actions import PodActions, compute_pod_actions
from trio_kubelet.core.active_deadline import (
    DEADLINE_EXCEEDED_MESSAGE,
    REASON_DEADLINE_EXCEEDED,
    seconds_to_deadline,
)
from trio_kubelet.core.admission import Rejection
from trio_kubelet.core.backoff import Backoff, backoff_key, crash_loop_message
from trio_kubelet.core.eviction import REASON_EVICTED, Eviction
from trio_kubelet.core.grace import (
    at_least_minimum,
    remaining_grace,
    termination_grace_period,
    termination_prerequisites,
)
from trio_kubelet.core.objects import no_objects
from trio_kubelet.core.observed import (
    ContainerState,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.core.pleg import PlegChange, accounted_changes
from trio_kubelet.core.pod_dns import MISSING_CLUSTER_DNS, MISSING_CLUSTER_DNS_MESSAGE, pod_dns
from trio_kubelet.core.probes import ProbeType
from trio_kubelet.images.manager import ImageError, ImageManager
from trio_kubelet.kube_events import EventRecorder, pod_ref
from trio_kubelet.model.pod import Container, LifecycleHandler, Pod, PodStatus, is_sidecar
from trio_kubelet.probes.results import ProbeResults
from trio_kubelet.reconcile.container_setup import (
    ContainerConfigError,
    NodeFacts,
    prepare_container,
)
from trio_kubelet.reconcile.hooks import run_hook
from trio_kubelet.reconcile.start_order import StartOrder
from trio_kubelet.reconcile.stop_order import StopOrder
from trio_kubelet.recording.pod_decisions import PodStatusDecision, PodSync, StatusInputs
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.resources.cgroups import CgroupError, QOSCgroups
from trio_kubelet.runtime import configs
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1 as cri
from trio_kubelet.runtime.errors import CRIError, CRINotFound
from trio_kubelet.runtime.inspect import (
    TerminationMessages,
    detailed_sandbox,
    inspect_pod,
    with_created,
)
from trio_kubelet.status.store import PodStatusStore
from trio_kubelet.volumes import VolumeError, VolumeManager

log = logging.getLogger("trio_kubelet.workers")

# The Go kubelet retries a pod whose sync failed after backOffPeriod.
SYNC_ERROR_RETRY = 10.0
# Grace for killing containers of a pod the agent no longer knows the spec of.
ORPHAN_GRACE = 2
# The kill reason (and Killing event message) after a failed postStart hook, as Go's.
REASON_FAILED_POST_START_HOOK = "FailedPostStartHook"


@dataclass(frozen=True)
class WorkerContext:
    """What every pod worker shares: the runtime, the image manager, the status store, time."""

    client: CRIClient
    images: ImageManager
    store: PodStatusStore
    clock: TrioWallClock
    pod_logs_dir: Path
    node_ip: str = ""
    runtime_name: str = "containerd"
    recorder: Recorder | None = None
    events: EventRecorder = field(default_factory=EventRecorder)  # log-only unless wired
    probe_results: ProbeResults = field(default_factory=ProbeResults)
    objects: PodObjects | None = None  # the ConfigMaps and Secrets pods refer to (API only)
    qos: QOSCgroups | None = None  # the kubepods hierarchy, with cgroupsPerQOS
    volumes: VolumeManager | None = None
    tokens: TokenSource | None = None  # service-account tokens (API only)
    node: NodeFacts = field(default_factory=NodeFacts)
    stop_order: StopOrder = field(default_factory=StopOrder)  # one per node: see its module
    start_order: StartOrder = field(default_factory=StartOrder)  # one per node: see its module
    # Told after each status change of a pod (the probe manager's early first probe).
    on_status: Callable[[str], None] = lambda uid: None


@dataclass
class _SyncResult:
    """What one sync decided (its actions, the gates of its starts) and left behind: errors,
    when to look again."""

    sync: PodSync
    errors: dict[str, tuple[str, str]] = field(default_factory=dict)
    requeue_at: float = math.inf
    # What the actions made, so the look after them need not list the pod again
    # (`PodWorker._look_after`): the new sandbox, the new containers (id, sandbox id).
    new_sandbox: RuntimeSandbox | None = None
    new_containers: list[tuple[str, str]] = field(default_factory=list)
    # The actions killed or removed something, or failed halfway: only a full inspection
    # tells what is left.
    needs_inspection: bool = False

    @property
    def now(self) -> float:
        return self.sync.now

    def retry_in(self, seconds: float) -> None:
        self.requeue_at = min(self.requeue_at, trio.current_time() + seconds)

    @property
    def changed(self) -> bool:
        """Whether the actions changed the pod in the runtime (the sync looks again)."""
        return (self.sync.actions.kill_pod or self.needs_inspection
                or self.new_sandbox is not None or bool(self.new_containers))


class PodWorker:
    """Owns one pod UID for its whole life on the node, from first sync to teardown."""

    def __init__(self, uid: str, ctx: WorkerContext, node_pods: Callable[[], list[Pod]]) -> None:
        self.uid = uid
        self.pod: Pod | None = None  # the desired pod; None = tear down
        # The pod as its status was last published (None: never, or torn down since): what
        # a teardown kills by, and what the QoS tiers count while the pod is on the node.
        self.published: Pod | None = None
        # The pods on the node (every worker's ``published``), from the sync loop.
        self._node_pods = node_pods
        self.spec_seq = -1  # seq of the event that set ``pod`` (for recordings)
        self.syncing: tuple[int, Pod] | None = None  # the spec version a running sync uses
        self._requeue_at = math.inf
        self._waiting: trio.CancelScope | None = None
        self._errors: dict[str, tuple[str, str]] = {}  # the last sync's, until the next one
        self._ctx = ctx
        self._wake_send, self._wake_recv = trio.open_memory_channel[None](1)
        self._woken = False  # since the last sync: by something else than PLEG news
        self._news: list[PlegChange] = []  # since the last sync
        # What the last sync left, when it left nothing to do: news of it needs no sync.
        self._accounted: frozenset[PlegChange] = frozenset()
        self._backoff = Backoff()
        self._status: PodStatus | None = None
        # The pod in the runtime as the last sync left it: a teardown kills from it at once.
        self._observed: RuntimePodStatus | None = None
        self._messages = TerminationMessages()  # exited containers' messages, read once
        self.rejection: Rejection | None = None  # set once at admission; the pod never runs
        # Set by the sync loop when nothing of this UID can be in the runtime (it listed the
        # runtime since the agent started, saw nothing of it, and no worker had it before):
        # the first sync skips its look at the runtime.
        self.known_absent = False
        self.eviction: Eviction | None = None  # set by the eviction manager; never runs again

    @property
    def admitted_pod(self) -> Pod | None:
        """The pod as admission counts it: wanted, admitted, and not finished."""
        if self.pod is None or self.rejection is not None or self.eviction is not None:
            return None
        if self._status is not None and self._status.phase in ("Succeeded", "Failed"):
            return None
        return self.pod

    def wake(self) -> None:
        """Ask for a sync; a wake-up already pending absorbs this one."""
        self._woken = True
        self._send_wake()

    def tell(self, container_id: str, change: str) -> None:
        """PLEG news of one of the pod's containers or sandboxes: a sync, unless the last
        sync saw that already and left nothing to do (a container it started, reported
        back: a start of 110 pods on containerd 2.x made 241 syncs, 131 of them after
        the first, each with its look at the runtime)."""
        self._news.append((container_id, change))
        self._send_wake()

    def _send_wake(self) -> None:
        with contextlib.suppress(trio.WouldBlock):
            self._wake_send.send_nowait(None)

    def _only_news_seen(self) -> bool:
        """Whether what woke the worker is only PLEG news its last sync saw and left nothing
        to do about (`accounted_changes`), or nothing (a wake-up whose reasons an earlier
        one took); forgets what woke it."""
        news, woken = self._news, self._woken
        self._news, self._woken = [], False
        return not woken and all(change in self._accounted for change in news)

    def wake_at(self, when: float) -> None:
        """Ask for a sync no later than ``when`` (trio time), e.g. a spread-out resync."""
        self._requeue_at = min(self._requeue_at, when)
        if self._waiting is not None:
            self._waiting.deadline = self._requeue_at

    def evict(self, message: str, grace: int, reason: str = REASON_EVICTED) -> None:
        """Kill the pod with ``grace`` seconds and end it Failed with ``reason`` (Evicted, or
        Terminated for a node shutdown); the first order wins."""
        if self.eviction is None:
            self.eviction = Eviction(message, grace, reason)
        self.wake()

    async def run(self) -> None:
        """Sync on every wake-up (or when a backoff expires) until the pod is torn down."""
        while True:
            with trio.move_on_at(self._requeue_at) as waiting:
                self._waiting = waiting
                await self._wake_recv.receive()
            self._waiting = None
            if not waiting.cancelled_caught and self._only_news_seen():
                continue
            self._requeue_at = math.inf
            pod, spec_seq = self.pod, self.spec_seq
            try:
                if pod is None:
                    await self._terminate()
                    if self.pod is None:
                        return
                    next_sync = trio.current_time()
                else:
                    next_sync = await self._sync(pod, spec_seq)
            except CRIError as err:
                log.warning(
                    "Error syncing pod %s (%s), retrying in %.0fs: %s",
                    _pod_name(pod, self.uid),
                    self.uid,
                    SYNC_ERROR_RETRY,
                    err,
                )
                if pod is not None and self._status is None:
                    # Never synced: still show the pod (Pending, ContainerCreating).
                    self._publish(pod, spec_seq, RuntimePodStatus(uid=self.uid),
                                  self._ctx.clock.now(), {})
                next_sync = trio.current_time() + SYNC_ERROR_RETRY
            except Exception:  # a bug in one pod's sync must not take down the others
                log.exception(
                    "Unexpected error syncing pod %s (%s)", _pod_name(pod, self.uid), self.uid
                )
                next_sync = trio.current_time() + SYNC_ERROR_RETRY
            self._requeue_at = min(self._requeue_at, next_sync)

    # -- sync --------------------------------------------------------------------------------

    async def _sync(self, pod: Pod, spec_seq: int) -> float:
        """One SyncPod: compute actions, execute them, publish the status; return requeue time."""
        if self.rejection is not None:
            await self._sync_rejected(pod, spec_seq, self.rejection)
            return math.inf
        if self.eviction is None and self._past_active_deadline(pod):
            self._ctx.events.pod_event(
                pod, "Normal", REASON_DEADLINE_EXCEEDED, DEADLINE_EXCEEDED_MESSAGE
            )
            grace = termination_grace_period(pod, None, REASON_DEADLINE_EXCEEDED)
            self.eviction = Eviction(
                DEADLINE_EXCEEDED_MESSAGE, grace, REASON_DEADLINE_EXCEEDED, disruption=False
            )
        if self.eviction is not None:
            await self._sync_evicted(pod, spec_seq, self.eviction)
            return math.inf
        self.syncing = (spec_seq, pod)
        try:
            return await self._sync_spec(pod, spec_seq)
        finally:
            self.syncing = None

    async def _sync_spec(self, pod: Pod, spec_seq: int) -> float:
        ctx = self._ctx
        if self.known_absent:
            self.known_absent = False
            runtime = RuntimePodStatus(uid=self.uid)
        else:
            runtime = await inspect_pod(ctx.client, self.uid, pod=pod, messages=self._messages)
        sync = PodSync.decide(
            ctx.recorder, self.uid, pod, spec_seq, runtime, now=ctx.clock.now(),
            liveness=ctx.probe_results.of(self.uid, ProbeType.LIVENESS),
            startup=ctx.probe_results.of(self.uid, ProbeType.STARTUP),
        )
        result = _SyncResult(sync)
        # As the Go kubelet: publish what is observed before acting, so a long kill
        # (grace periods) does not hide that a container already exited.
        self._publish(pod, spec_seq, runtime, sync.now, self._errors)
        await self._execute(pod, runtime, sync.actions, result)
        sync.finish()
        self._errors = result.errors
        changed = result.changed
        if changed:
            runtime = await self._look_after(pod, runtime, result)
        self._observed = runtime
        # What it left may call for more (the next init container once a sidecar runs). Not
        # a decision to record: it only says whether PLEG news of this look needs a sync,
        # and that sync decides (and records) for itself.
        left = compute_pod_actions(
            pod, runtime, liveness=ctx.probe_results.of(self.uid, ProbeType.LIVENESS),
            startup=ctx.probe_results.of(self.uid, ProbeType.STARTUP),
        ) if changed else sync.actions
        self._accounted = frozenset() if left.reasons else accounted_changes(runtime)
        self._publish(pod, spec_seq, runtime, ctx.clock.now(), result.errors)
        to_deadline = self._seconds_to_deadline(pod)
        if to_deadline is not None:  # wake up at the deadline (now, if the first sync passed it)
            result.retry_in(max(to_deadline, 0.0))
        return result.requeue_at

    async def _look_after(
        self, pod: Pod, before: RuntimePodStatus, result: _SyncResult
    ) -> RuntimePodStatus:
        """The pod in the runtime after a sync's actions: ``before`` plus what they made
        when they only made things, else a fresh inspection."""
        client = self._ctx.client
        if result.needs_inspection:
            return await inspect_pod(client, self.uid, pod=pod, messages=self._messages)
        return await with_created(client, before, result.new_sandbox, result.new_containers,
                                  pod=pod, messages=self._messages)

    def _seconds_to_deadline(self, pod: Pod) -> float | None:
        start_time = None if self._status is None else self._status.start_time
        return seconds_to_deadline(pod, start_time, self._ctx.clock.now())

    def _past_active_deadline(self, pod: Pod) -> bool:
        left = self._seconds_to_deadline(pod)
        return left is not None and left <= 0

    async def _sync_rejected(self, pod: Pod, spec_seq: int, rejection: Rejection) -> None:
        """Keep a refused pod from running (it may have run before an agent restart)."""
        runtime = await inspect_pod(self._ctx.client, self.uid)
        if runtime.containers or runtime.sandboxes:
            await self._kill_pod(pod, runtime)
            runtime = await inspect_pod(self._ctx.client, self.uid)
        self._set_status(pod, runtime, self._status_inputs(
            "rejected", spec_seq, None, reason=rejection.reason, message=rejection.message))

    async def _sync_evicted(self, pod: Pod, spec_seq: int, eviction: Eviction) -> None:
        """Report an evicted pod Failed/Evicted, stop it with the eviction's grace, report again.

        The grace goes in as the pod's deletion grace period, which every kill path takes
        before the pod's own (Go hands it to the kill as an override).
        """
        ctx = self._ctx
        runtime = await inspect_pod(ctx.client, self.uid, pod=pod, messages=self._messages)
        self._set_evicted_status(pod, spec_seq, runtime, eviction)
        running = any(c.state is ContainerState.RUNNING for c in runtime.containers)
        if running or any(s.state is SandboxState.READY for s in runtime.sandboxes):
            doomed = pod.model_copy(deep=True)
            doomed.metadata.deletion_grace_period_seconds = eviction.grace
            await self._kill_pod(doomed, runtime)
            runtime = await inspect_pod(ctx.client, self.uid, pod=pod, messages=self._messages)
            self._set_evicted_status(pod, spec_seq, runtime, eviction)

    def _set_evicted_status(
        self, pod: Pod, spec_seq: int, runtime: RuntimePodStatus, eviction: Eviction
    ) -> None:
        self._set_status(pod, runtime, self._status_inputs(
            "evicted", spec_seq, runtime, now=self._ctx.clock.now(), terminal=True,
            reason=eviction.reason, message=eviction.message, disruption=eviction.disruption))

    async def _execute(
        self, pod: Pod, runtime: RuntimePodStatus, actions: PodActions, result: _SyncResult
    ) -> None:
        """The actions in Go's SyncPod order; what they did goes into ``result``."""
        if actions.create_sandbox and actions.sandbox_id:
            message = "Pod sandbox changed, it will be killed and re-created."
            self._ctx.events.pod_event(pod, "Normal", "SandboxChanged", message)
        if actions.kill_pod and runtime.sandboxes:
            log.info(
                "Killing pod %s (%s): %s",
                pod.full_name,
                self.uid,
                actions.kill_pod_reason or "the sandbox changed",
            )
            await self._kill_pod(pod, runtime)
            if actions.create_sandbox:
                await self._remove_init_containers(pod, runtime, keep_newest=False)
            result.needs_inspection = True
        else:
            await self._kill_containers(pod, runtime, actions)
            removed = await self._remove_init_containers(pod, runtime, keep_newest=True)
            result.needs_inspection = removed or bool(actions.containers_to_kill)
        if self._objects_unanswered(pod):
            return
        volume_paths = await self._set_up_volumes(pod, result)
        if volume_paths is None:
            return
        if actions.kill_pod and not actions.create_sandbox:
            return  # the pod stops for good: nothing to make
        starts = (actions.ephemeral_containers_to_start or actions.init_containers_to_start
                  or actions.containers_to_start)
        objects = self._ctx.objects
        if objects is not None and starts:
            await objects.wait_for_services(pod)
        makes = actions.create_sandbox or starts
        async with self._ctx.start_order.pod_start() if makes else contextlib.nullcontext():
            await self._make(pod, runtime, actions, volume_paths, result)

    async def _make(
        self,
        pod: Pod,
        runtime: RuntimePodStatus,
        actions: PodActions,
        volume_paths: dict[str, Path],
        result: _SyncResult,
    ) -> None:
        """The sandbox (if the actions want a new one) and the containers the actions start."""
        sandbox_id = actions.sandbox_id
        pod_ips = runtime.sandboxes[0].ips if runtime.sandboxes else []
        if actions.create_sandbox:
            sandbox_id = await self._create_sandbox(pod, actions.attempt, result)
            if not sandbox_id:
                result.needs_inspection = True
                return
            result.new_sandbox = await self._new_sandbox(sandbox_id)
            result.needs_inspection |= result.new_sandbox is None
            pod_ips = result.new_sandbox.ips if result.new_sandbox is not None else []
        if pod.spec.host_network:
            pod_ips = list(self._ctx.node.host_ips)
        sandbox = self._sandbox_config(pod, actions.attempt)
        start = partial(self._start, pod, runtime, sandbox_id=sandbox_id, sandbox=sandbox,
                        pod_ips=pod_ips, volume_paths=volume_paths, result=result)
        spec = pod.spec
        for index in actions.ephemeral_containers_to_start:
            await start(spec.ephemeral_containers[index], "ephemeral")
        for index in actions.init_containers_to_start:
            init = spec.init_containers[index]
            kind = "sidecar" if is_sidecar(init) else "init"
            if not await start(init, kind) and kind == "init":
                break
        for index in actions.containers_to_start:
            await start(spec.containers[index], "regular")

    def _objects_unanswered(self, pod: Pod) -> bool:
        """Whether the caches are still listing objects the pod refers to.

        Such a pod is not set up yet (a new pod's references are watched only from now
        on: not an error, and no reason for the 10 s retry); the worker is woken as each
        object gets its first answer. Go's volume manager retries its mounts every 100 ms
        to the same end. A missing object is then reported as such.
        """
        objects = self._ctx.objects
        waiting = objects.unanswered(pod, self.wake) if objects is not None else []
        if waiting:
            log.info("Pod %s (%s) waits for %s to be listed",
                     pod.full_name, self.uid, ", ".join(waiting))
        return bool(waiting)

    async def _set_up_volumes(self, pod: Pod, result: _SyncResult) -> dict[str, Path] | None:
        """Set up (or refresh) the pod's volumes; None while one cannot be (the pod waits).

        Every sync refreshes ConfigMap, Secret, downward API and token contents, so
        updates reach running containers within the sync period.
        """
        ctx = self._ctx
        if ctx.volumes is None or not pod.spec.volumes:
            return {}
        try:
            return await ctx.volumes.set_up(
                pod,
                ctx.objects.lookup if ctx.objects is not None else no_objects,
                node_allocatable=ctx.node.allocatable or {},
                token_for=ctx.tokens,
            )
        except VolumeError as err:  # already a FailedMount event
            log.warning("Volumes of pod %s (%s) not ready: %s", pod.full_name, self.uid, err)
            result.retry_in(SYNC_ERROR_RETRY)
            return None

    async def _new_sandbox(self, sandbox_id: str) -> RuntimeSandbox | None:
        """The new sandbox as the runtime has it: its IPs, for the environment
        (status.podIP(s)), and the sync's look after its actions."""
        response = await self._ctx.client.pod_sandbox_status(sandbox_id)
        if response.status is None:
            return None
        return detailed_sandbox(response.status)

    def _sandbox_config(self, pod: Pod, attempt: int) -> cri.PodSandboxConfig:
        """The pod's CRI sandbox config; its DNS warnings are events, at every call as in Go."""
        ctx = self._ctx
        qos = ctx.qos
        parent = qos.cgroup_parent(pod) if qos is not None else ""
        dns = pod_dns(pod, ctx.node.dns) if ctx.node.dns is not None else None
        for warning in dns.warnings if dns is not None else ():
            ctx.events.pod_event(pod, "Warning", warning.reason, warning.message)
            if warning.reason == MISSING_CLUSTER_DNS:
                ctx.events.node_event(
                    ctx.events.node_name, "Warning", warning.reason, MISSING_CLUSTER_DNS_MESSAGE
                )
        return configs.sandbox_config(
            pod,
            attempt,
            ctx.pod_logs_dir,
            cgroup_parent=parent,
            dns=dns.config if dns is not None else None,
        )

    async def _create_sandbox(self, pod: Pod, attempt: int, result: _SyncResult) -> str:
        config = self._sandbox_config(pod, attempt)
        try:
            _make_log_directory(Path(config.log_directory))
            await self._ensure_pod_cgroup(pod)
            sandbox_id = await self._ctx.client.run_pod_sandbox(config)
        except (CRIError, CgroupError, _LogDirectoryError) as err:
            log.error("Failed to create sandbox for pod %s (%s): %s", pod.full_name, self.uid, err)
            self._ctx.events.pod_event(
                pod,
                "Warning",
                "FailedCreatePodSandBox",
                f"Failed to create pod sandbox: {err}",
                logged=True,
            )
            for container in pod.spec.containers:
                result.errors[container.name] = ("CreatePodSandboxError", str(err))
            result.retry_in(SYNC_ERROR_RETRY)
            return ""
        log.info(
            "Created sandbox %s for pod %s (%s), attempt %d",
            sandbox_id[:13],
            pod.full_name,
            self.uid,
            attempt,
        )
        return sandbox_id

    async def _ensure_pod_cgroup(self, pod: Pod) -> None:
        """The pod's cgroup with its limits, the QoS tiers counting it (Go's syncPod order)."""
        qos = self._ctx.qos
        if qos is None:
            return
        others = [p for p in self._node_pods() if p.metadata.uid != self.uid]
        await qos.update_qos([*others, pod])
        await qos.ensure_pod(pod)

    async def _start(
        self,
        pod: Pod,
        runtime: RuntimePodStatus,
        container: Container,
        kind: str,
        *,
        sandbox_id: str,
        sandbox: cri.PodSandboxConfig,
        pod_ips: list[str],
        volume_paths: dict[str, Path],
        result: _SyncResult,
    ) -> bool:
        """Start one container unless it is in crash-loop backoff; record why it did not start.
        True once the container was created (its start may still have failed)."""
        ctx = self._ctx
        now = result.now
        newest = runtime.find(container.name)
        gate = result.sync.gate(self._backoff, backoff_key(pod, container), container.name, newest)
        self._backoff = gate.backoff
        if not gate.allowed:
            message = crash_loop_message(gate.delay, pod, container)
            result.errors[container.name] = ("CrashLoopBackOff", message)
            result.retry_in(gate.remaining)
            ctx.events.pod_event(
                pod,
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {container.name} in pod "
                f"{pod.full_name}({self.uid})",
                container.name,
            )
            return False
        try:
            image_ref = await ctx.images.ensure(
                container,
                self.uid,
                now,
                ref=pod_ref(pod, container.name),
                pod=pod,
                objects=ctx.objects.lookup if ctx.objects is not None else None,
            )
        except ImageError as err:
            ctx.events.pod_event(pod, "Warning", "Failed", f"Error: {err.reason}", container.name)
            result.errors[container.name] = (err.reason, err.message)
            # Retry when the pull backoff ends, not a sync-error period later.
            result.retry_in(err.retry_in if err.retry_in is not None else SYNC_ERROR_RETRY)
            return False
        log_dir = Path(sandbox.log_directory) / container.name
        if newest is not None:
            restart_count = newest.restart_count + 1
        else:  # every instance was removed (a new sandbox purges init containers)
            restart_count = restart_count_from_logs(log_dir)
        try:
            config = await prepare_container(
                ctx.client,
                ctx.objects.lookup if ctx.objects is not None else no_objects,
                ctx.node,
                pod,
                container,
                pod_ips,
                kind=kind,
                image_ref=image_ref,
                restart_count=restart_count,
                volume_paths=volume_paths,
                pod_dir=ctx.volumes.pod_dir(self.uid) if ctx.volumes is not None else None,
            )
        except ContainerConfigError as err:
            ctx.events.pod_event(pod, "Warning", "Failed", f"Error: {err.message}", container.name)
            result.errors[container.name] = (err.reason, err.message)
            result.retry_in(SYNC_ERROR_RETRY)
            return False
        try:
            _make_log_directory(log_dir)
        except _LogDirectoryError as err:  # Go: generateContainerConfig's error
            message = f"create container log directory for container {container.name} failed: {err}"
            ctx.events.pod_event(pod, "Warning", "Failed", f"Error: {message}", container.name)
            result.errors[container.name] = ("CreateContainerConfigError", message)
            result.retry_in(SYNC_ERROR_RETRY)
            return False
        try:
            container_id = await ctx.client.create_container(sandbox_id, config, sandbox)
        except CRIError as err:
            ctx.events.pod_event(pod, "Warning", "Failed", f"Error: {err.message}", container.name)
            result.errors[container.name] = ("CreateContainerError", err.message)
            result.retry_in(SYNC_ERROR_RETRY)
            return False
        result.new_containers.append((container_id, sandbox_id))
        message = f"Created container: {container.name}"
        ctx.events.pod_event(pod, "Normal", "Created", message, container.name)
        try:
            await ctx.client.start_container(container_id)
        except CRIError as err:
            ctx.events.pod_event(pod, "Warning", "Failed", f"Error: {err.message}", container.name)
            result.errors[container.name] = ("RunContainerError", err.message)
            result.retry_in(SYNC_ERROR_RETRY)
            return True
        log.info(
            "Started container %s of pod %s (%s): %s, restart %d",
            container.name,
            pod.full_name,
            self.uid,
            container_id[:13],
            restart_count,
        )
        message = f"Started container {container.name}"
        ctx.events.pod_event(pod, "Normal", "Started", message, container.name, logged=True)
        post_start = container.lifecycle.post_start if container.lifecycle else None
        if post_start is not None:
            pod_ip = pod_ips[0] if pod_ips else ""
            await self._post_start(pod, container, container_id, post_start, pod_ip, result)
        return True

    async def _post_start(
        self,
        pod: Pod,
        container: Container,
        container_id: str,
        hook: LifecycleHandler,
        pod_ip: str,
        result: _SyncResult,
    ) -> None:
        """Run the postStart hook; the start is not done until it is (Go blocks too).

        A failed hook kills the instance, and the restart policy treats it as any exit.
        """
        ctx = self._ctx
        failure = await run_hook(ctx.client, hook, pod, container, container_id, pod_ip)
        if failure is None:
            return
        self._report_hook_failure(pod, container, "postStart", failure)
        result.needs_inspection = True
        await self._kill_container(
            pod,
            container_id,
            container.name,
            container,
            reason=REASON_FAILED_POST_START_HOOK,
            message=REASON_FAILED_POST_START_HOOK,
            pod_ip=pod_ip,
        )
        result.errors[container.name] = ("PostStartHookError", failure)
        result.retry_in(SYNC_ERROR_RETRY)

    # -- killing ----------------------------------------------------------------------------

    async def _kill_containers(
        self, pod: Pod, runtime: RuntimePodStatus, actions: PodActions
    ) -> None:
        specs = _specs_by_name(pod)
        pod_ip = self._pod_ip(pod, runtime)
        async with trio.open_nursery() as nursery:
            for container_id, kill in actions.containers_to_kill.items():
                nursery.start_soon(
                    partial(
                        self._kill_container,
                        pod,
                        container_id,
                        kill.name,
                        specs.get(kill.name),
                        reason=kill.reason,
                        message=kill.message,
                        pod_ip=pod_ip,
                    )
                )

    async def _kill_pod(self, pod: Pod | None, runtime: RuntimePodStatus) -> None:
        """Stop every running container at once, then the sandboxes (once containers
        elsewhere on the node that are being killed have gone: `StopOrder`).

        Each container runs its preStop hook first. Sidecars outlive the containers they
        serve: each then waits for the regular containers and the sidecars declared
        after it, within what is left of its grace period.
        """
        running = [c for c in runtime.containers if c.state is ContainerState.RUNNING]
        async with trio.open_nursery() as nursery:
            if pod is None:
                for container in running:
                    nursery.start_soon(self._stop_container, container.id, ORPHAN_GRACE)
            else:
                specs = _specs_by_name(pod)
                pod_ip = self._pod_ip(pod, runtime)
                stopped = {c.name: trio.Event() for c in running}
                order = termination_prerequisites(pod, stopped.keys())
                for container in running:
                    before = [stopped[name] for name in order.get(container.name, ())]
                    nursery.start_soon(
                        partial(
                            self._kill_container,
                            pod,
                            container.id,
                            container.name,
                            specs.get(container.name),
                            pod_ip=pod_ip,
                            turn=partial(_all_set, before) if before else None,
                            done=stopped[container.name],
                        )
                    )
        ready = [s for s in runtime.sandboxes if s.state is SandboxState.READY]
        if ready:
            await self._ctx.stop_order.sandbox_turn()
        for sandbox in ready:
            with contextlib.suppress(CRINotFound):  # gone: nothing left to stop
                await self._ctx.client.stop_pod_sandbox(sandbox.id)

    async def _kill_container(
        self,
        pod: Pod,
        container_id: str,
        name: str,
        spec: Container | None,
        *,
        pod_ip: str,
        reason: str = "",
        message: str = "",
        turn: Callable[[], Awaitable[None]] | None = None,
        done: trio.Event | None = None,
    ) -> None:
        """killContainer: the Killing event, the preStop hook, the container's turn (a
        sidecar), then StopContainer with what is left of the grace period (at least 2 s)."""
        grace = termination_grace_period(pod, spec, reason)
        log.info(
            "Killing container %s of pod %s (%s) with %ds grace: %s",
            name,
            pod.full_name,
            self.uid,
            grace,
            message or reason or "the pod is stopping",
        )
        self._ctx.events.pod_event(
            pod, "Normal", "Killing", message or f"Stopping container {name}", name, logged=True
        )
        try:
            hook = spec.lifecycle.pre_stop if spec is not None and spec.lifecycle else None
            if hook is not None and spec is not None and grace > 0:
                waited = await self._pre_stop(pod, spec, container_id, hook, grace, pod_ip)
                grace = remaining_grace(grace, waited)
            if turn is not None and grace > 0:
                started = trio.current_time()
                with trio.move_on_after(grace):
                    await turn()
                grace = remaining_grace(grace, trio.current_time() - started)
            await self._stop_container(container_id, at_least_minimum(grace))
        finally:
            if done is not None:
                done.set()

    async def _pre_stop(
        self,
        pod: Pod,
        container: Container,
        container_id: str,
        hook: LifecycleHandler,
        grace: int,
        pod_ip: str,
    ) -> float:
        """Run the preStop hook for at most ``grace`` seconds; return how long it ran.

        A failure is reported and the kill goes on, as does one that runs out of time.
        """
        ctx = self._ctx
        started = trio.current_time()
        failure = None
        with trio.move_on_after(grace) as bounded:
            failure = await run_hook(ctx.client, hook, pod, container, container_id, pod_ip)
        if bounded.cancelled_caught:
            log.info(
                "preStop hook of container %s of pod %s (%s) did not end within %ds",
                container.name,
                pod.full_name,
                self.uid,
                grace,
            )
        elif failure is not None:
            self._report_hook_failure(pod, container, "preStop", failure)
        return trio.current_time() - started

    def _pod_ip(self, pod: Pod, runtime: RuntimePodStatus) -> str:
        """Where an httpGet hook without a host goes: the pod IP (the node's, host network)."""
        if pod.spec.host_network:
            return self._ctx.node.host_ips[0] if self._ctx.node.host_ips else ""
        return runtime.ip

    async def _stop_container(self, container_id: str, grace: int) -> None:
        with contextlib.suppress(CRINotFound), self._ctx.stop_order.container_stop(grace):
            await self._ctx.client.stop_container(container_id, timeout=grace)

    async def _remove_init_containers(
        self, pod: Pod, runtime: RuntimePodStatus, *, keep_newest: bool
    ) -> bool:
        """Remove exited init container instances, sidecars included (all, or all but the
        newest); whether there were any.

        With a new sandbox every old instance goes (Go's purgeInitContainers), or a
        sidecar's exit in the dead sandbox would count as progress in the new one.
        """
        removed = False
        for init in pod.spec.init_containers:
            exited = [c for c in runtime.instances(init.name) if c.state is ContainerState.EXITED]
            for instance in exited[1:] if keep_newest else exited:
                await self._ctx.client.remove_container(instance.id)
                removed = True
        return removed

    def _report_hook_failure(
        self, pod: Pod, container: Container, hook: str, failure: str
    ) -> None:
        """A log line with the hook's output (``hook``: the spec's field name), a
        Failed<Hook>Hook event without it (as Go: the output may hold secrets)."""
        log.warning(
            "%s hook of container %s of pod %s (%s) failed: %s",
            hook, container.name, pod.full_name, self.uid, failure,
        )
        name = hook[0].upper() + hook[1:]
        self._ctx.events.pod_event(
            pod, "Warning", f"Failed{name}Hook", f"{name}Hook failed", container.name, logged=True
        )

    # -- teardown ---------------------------------------------------------------------------

    async def _terminate(self) -> None:
        """Tear the pod down: kill with grace, then remove its containers, sandboxes and logs.

        The kill starts from what the last sync saw (the Go kubelet's from its pod cache),
        so the stop signals go out at once, not after a fresh look at the runtime (which,
        with 110 pods going at once, took the first 0.5-0.8 s of a teardown); the fresh
        look follows and kills whatever that sync had not seen.
        """
        ctx = self._ctx
        seen = self._observed
        runtime = seen if seen is not None else await inspect_pod(ctx.client, self.uid)
        pod = self.published
        name = pod.full_name if pod else f"{runtime.name}_{runtime.namespace}"
        log.info("Tearing down pod %s (%s)", name, self.uid)
        await self._kill_pod(pod, runtime)
        if seen is not None:
            runtime = await inspect_pod(ctx.client, self.uid)
            await self._kill_pod(pod, runtime)
        # RemovePodSandbox removes the sandbox's containers too (CRI); only a container
        # whose sandbox is not listed needs a RemoveContainer of its own.
        sandbox_ids = {sandbox.id for sandbox in runtime.sandboxes}
        for container in runtime.containers:
            if container.sandbox_id not in sandbox_ids:
                await ctx.client.remove_container(container.id)
        for sandbox in runtime.sandboxes:
            await ctx.client.remove_pod_sandbox(sandbox.id)
        # By UID alone: the directory may exist without any sandbox to name the pod.
        for log_dir in ctx.pod_logs_dir.glob(f"*_{self.uid}"):
            shutil.rmtree(log_dir, ignore_errors=True)
        if ctx.volumes is not None:
            await ctx.volumes.tear_down(self.uid)
        if ctx.tokens is not None:
            ctx.tokens.forget_pod(self.uid)
        if ctx.qos is not None:
            try:
                await ctx.qos.remove_pod(self.uid)
                await ctx.qos.update_qos(p for p in self._node_pods() if p.metadata.uid != self.uid)
            except CgroupError as err:  # the orphan sweep tries again
                log.warning("Removing the cgroups of pod %s (%s) failed: %s", name, self.uid, err)
        ctx.store.remove(self.uid)
        self.published = None
        if ctx.recorder is not None:
            ctx.recorder.teardown(self.uid, name)
        log.info("Pod %s (%s) is gone", name, self.uid)

    # -- status -----------------------------------------------------------------------------

    def _publish(
        self, pod: Pod, spec_seq: int, runtime: RuntimePodStatus, now: float,
        errors: dict[str, tuple[str, str]],
    ) -> None:
        self._set_status(pod, runtime, self._status_inputs(
            "sync", spec_seq, runtime, now=now, errors=errors))

    def _status_inputs(
        self, decided: Literal["sync", "rejected", "evicted"], spec_seq: int,
        runtime: RuntimePodStatus | None, **rest: Any,
    ) -> StatusInputs:
        """What the pod's status is decided from now: ``runtime`` and ``rest``, the probe
        results, the node's facts, and the status published last."""
        ctx = self._ctx
        return StatusInputs(
            decided, spec_seq, runtime, self._status,
            readiness=ctx.probe_results.of(self.uid, ProbeType.READINESS),
            startup=ctx.probe_results.of(self.uid, ProbeType.STARTUP),
            host_ip=ctx.node_ip, runtime_name=ctx.runtime_name, **rest,
        )

    def _set_status(self, pod: Pod, runtime: RuntimePodStatus, inputs: StatusInputs) -> None:
        """Decide the pod's status from ``inputs`` (recorded when it changed) and publish it."""
        ctx = self._ctx
        self._status = PodStatusDecision.publish(ctx.recorder, self.uid, pod, inputs)
        self.published = pod
        stopped = not any(
            c.state is ContainerState.RUNNING for c in runtime.containers
        ) and not any(s.state is SandboxState.READY for s in runtime.sandboxes)
        ctx.store.set(pod, self._status, stopped=stopped)
        ctx.on_status(self.uid)


class _LogDirectoryError(Exception):
    """A pod's or container's log directory could not be made; the message is Go's
    (``mkdir <path>: <reason>``)."""


def _make_log_directory(path: Path) -> None:
    """``mkdir -p`` of a log directory under podLogsDir (at most two levels: not worth a
    thread); a directory the agent cannot write to is reported, not raised past the sync."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _LogDirectoryError(f"mkdir {err.filename or path}: {err.strerror or err}") from None


def restart_count_from_logs(log_dir: Path) -> int:
    """The next restart count from the container's log files ``<n>.log`` (calcRestartCountByLogDir).

    Keeps restart counts rising when no instance is left to carry the count.
    """
    try:
        counts = [int(p.stem) for p in log_dir.glob("*.log") if p.stem.isdigit()]
    except OSError:
        return 0
    return max(counts) + 1 if counts else 0


def _specs_by_name(pod: Pod | None) -> dict[str, Container]:
    if pod is None:
        return {}
    spec = pod.spec
    return {
        c.name: c
        for group in (spec.init_containers, spec.containers, spec.ephemeral_containers)
        for c in group
    }


async def _all_set(events: list[trio.Event]) -> None:
    for event in events:
        await event.wait()


def _pod_name(pod: Pod | None, uid: str) -> str:
    return pod.full_name if pod is not None else uid

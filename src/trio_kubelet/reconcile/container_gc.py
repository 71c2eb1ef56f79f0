"""Container GC: every minute, remove what ``core.container_gc`` chooses, through CRI.

Lists the runtime (the fast upb-decoded lists) and the pod logs directory, asks the
pure choice, then removes dead containers with their log files, the sandboxes left
empty, and the log directories of pods that are gone; with cgroupsPerQOS it also
removes pod cgroups no pod owns. A failed removal is logged and the pass goes on.
The eviction manager calls ``reclaim`` under disk pressure.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from trio_kubelet.core.container_gc import (
    GCContainer,
    GCPlan,
    GCPolicy,
    GCSandbox,
    log_dir_pod_uid,
)
from trio_kubelet.core.eviction import DISK_SIGNALS
from trio_kubelet.core.observed import ContainerState, SandboxState
from trio_kubelet.recording.node_decisions import ContainerGCPass
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.resources.cgroups import CgroupError, QOSCgroups
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.configs import container_log_path
from trio_kubelet.runtime.cri_upb.runtime.v1 import api_pb2 as upb
from trio_kubelet.runtime.errors import CRIError, CRINotFound
from trio_kubelet.runtime.labels import (
    CONTAINER_NAME,
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    RESTART_COUNT,
)

__all__ = ["CONTAINER_GC_PERIOD", "ContainerGC", "GCResult", "listed_container"]

log = logging.getLogger("trio_kubelet.container_gc")

CONTAINER_GC_PERIOD = 60.0  # the Go kubelet's ContainerGCPeriod
# Removals in flight at once: enough to hide the round trips, few enough not to
# crowd the runtime while pods are being started.
REMOVAL_CONCURRENCY = 8
# Grace for a container in an unknown state, stopped before it is removed (it may run).
UNKNOWN_STOP_GRACE = 2
_SOURCES_POLL = 1.0

_CONTAINER_STATES: dict[int, ContainerState] = {
    upb.CONTAINER_CREATED: ContainerState.CREATED,
    upb.CONTAINER_RUNNING: ContainerState.RUNNING,
    upb.CONTAINER_EXITED: ContainerState.EXITED,
    upb.CONTAINER_UNKNOWN: ContainerState.UNKNOWN,
}


@dataclass
class GCResult:
    """What one pass removed (and failed to), for its log line and for tests."""

    dead: int = 0
    containers: int = 0
    sandboxes: int = 0
    log_dirs: int = 0
    cgroups: int = 0
    failed: int = 0
    duration: float = 0.0
    # Sandboxes whose container could not be removed (removing the sandbox would take
    # it), and pods something of which is left that the plan meant to remove.
    blocked_sandboxes: set[str] = field(default_factory=set, repr=False)
    unfinished_pods: set[str] = field(default_factory=set, repr=False)


class ContainerGC:
    """The container GC task and its on-demand pass (``reclaim``).

    ``existing_pods`` and ``sources_ready`` come from the sync loop; ``clock`` is wall
    time (epoch seconds) as the runtime stamps creation times.
    """

    def __init__(
        self,
        client: CRIClient,
        policy: GCPolicy,
        *,
        existing_pods: Callable[[], Collection[str]],
        sources_ready: Callable[[], bool],
        pod_logs_dir: Path,
        clock: Callable[[], float],
        period: float = CONTAINER_GC_PERIOD,
        qos: QOSCgroups | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._client = client
        self.policy = policy
        self._existing_pods = existing_pods
        self._sources_ready = sources_ready
        self._pod_logs_dir = pod_logs_dir
        self._clock = clock
        self._period = period
        self._qos = qos
        self._recorder = recorder
        self._lock = trio.Lock()  # one pass at a time: the periodic one or a reclaim
        self.passes = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """A pass once every source has reported, then one every period.

        Waiting for the sources is what keeps a restarted agent from removing what
        belongs to pods a source has not reported yet.
        """
        task_status.started()
        while not self._sources_ready():
            await trio.sleep(_SOURCES_POLL)
        while True:
            try:
                await self.collect()
            except Exception:  # a bug here must not take the agent down; try next period
                log.exception("Container GC pass failed")
            await trio.sleep(self._period)

    async def reclaim(self, signal: str) -> None:
        """A pass now, for the eviction manager's node-level reclaim of ``signal``.

        Only disk signals are helped by removing containers; others return at once.
        """
        if signal not in DISK_SIGNALS:
            return
        log.info("Container GC: reclaiming for %s", signal)
        await self.collect()

    async def collect(self) -> GCResult:
        """One pass: list, choose, remove. Runtime errors are logged, never raised."""
        async with self._lock:
            started = trio.current_time()
            try:
                plan, in_runtime = await self._plan()
            except CRIError as err:
                log.warning("Container GC: listing the runtime failed: %s", err)
                return GCResult()
            result = GCResult(dead=plan.dead)
            with_sandbox, alone = _by_sandbox(plan)
            await self._remove_containers(alone, result)
            await self._remove_sandboxes(plan.sandboxes, with_sandbox, result)
            self._remove_log_dirs(plan.log_dirs, result)
            await self._sweep_pod_cgroups(in_runtime, result)
            result.duration = trio.current_time() - started
            self.passes += 1
            log.info(
                "Container GC: removed %d of %d dead containers, %d sandboxes, "
                "%d pod log directories, %d pod cgroups (%d failed) in %.3fs",
                result.containers,
                result.dead,
                result.sandboxes,
                result.log_dirs,
                result.cgroups,
                result.failed,
                result.duration,
            )
            return result

    async def _plan(self) -> tuple[GCPlan, set[str]]:
        """The plan, and the UIDs of every pod the runtime holds something of."""
        sandboxes = [_gc_sandbox(s) for s in await self._client.list_pod_sandbox_brief()]
        containers = [listed_container(c) for c in await self._client.list_containers_brief()]
        log_dirs = _pod_log_dirs(self._pod_logs_dir)  # one small directory: not worth a thread
        # Read last, so a pod added while the runtime was listed counts as existing.
        ready = self._sources_ready()
        existing = self._existing_pods()
        now = self._clock()
        plan = ContainerGCPass.decide(
            self._recorder, containers, sandboxes, policy=self.policy, now=now,
            existing_pods=existing, sources_ready=ready, log_dirs=log_dirs,
        )
        return plan, {c.pod_uid for c in containers} | {s.pod_uid for s in sandboxes}

    async def _remove_containers(self, containers: list[GCContainer], result: GCResult) -> None:
        """RemoveContainer each; one in an unknown state is stopped first (it may run)."""
        unknown = [c for c in containers if c.state is ContainerState.UNKNOWN]
        exited = [c for c in containers if c.state is not ContainerState.UNKNOWN]
        errors = await self._client.remove_containers(
            [c.id for c in exited], concurrency=REMOVAL_CONCURRENCY)
        for container, error in zip(exited, errors, strict=True):
            self._after_removal(container, error, result)
        for container in unknown:  # rare: one at a time
            await self._stop_and_remove(container, result)

    async def _stop_and_remove(self, container: GCContainer, result: GCResult) -> None:
        error: CRIError | None = None
        try:
            await self._client.stop_container(container.id, UNKNOWN_STOP_GRACE)
            await self._client.remove_container(container.id)
        except CRIError as err:
            error = err
        self._after_removal(container, error, result)

    def _after_removal(self, container: GCContainer, error: CRIError | None,
                       result: GCResult) -> None:
        """Count a removal and remove the log file; a failure is logged and blocks the pod."""
        if error is not None and not isinstance(error, CRINotFound):  # NotFound: already gone
            log.warning(
                "Container GC: removing container %s (%s of pod %s) failed: %s",
                container.id[:13],
                container.name,
                container.pod_uid,
                error,
            )
            result.failed += 1
            result.blocked_sandboxes.add(container.sandbox_id)
            result.unfinished_pods.add(container.pod_uid)
            return
        self._removed(container, result)

    async def _remove_sandboxes(
        self,
        sandboxes: Sequence[GCSandbox],
        with_sandbox: dict[str, list[GCContainer]],
        result: GCResult,
    ) -> None:
        """RemovePodSandbox, which takes a sandbox's containers with it (CRI says so):
        one call instead of one per container. A sandbox holding a container that
        could not be removed stays."""
        going = [s for s in sandboxes if s.id not in result.blocked_sandboxes]
        errors = await self._client.remove_pod_sandboxes(
            [s.id for s in going], concurrency=REMOVAL_CONCURRENCY)
        for sandbox, error in zip(going, errors, strict=True):
            if error is not None and not isinstance(error, CRINotFound):
                log.warning("Container GC: removing sandbox %s of pod %s failed: %s",
                            sandbox.id[:13], sandbox.pod_uid, error)
                result.failed += 1
                result.unfinished_pods.add(sandbox.pod_uid)
                continue
            log.debug("Container GC: removed sandbox %s of pod %s", sandbox.id[:13],
                      sandbox.pod_uid)
            result.sandboxes += 1
            for container in with_sandbox.get(sandbox.id, ()):
                self._removed(container, result)

    def _removed(self, container: GCContainer, result: GCResult) -> None:
        """Count a removed container and remove its log files, which the runtime leaves:
        the live one and those log rotation made of it (``<n>.log.<stamp>[.gz]``)."""
        result.containers += 1
        if not container.log_path:
            return
        path = self._pod_logs_dir / container.log_path
        for log_file in (path, *path.parent.glob(f"{path.name}.*")):
            try:
                os.unlink(log_file)
            except FileNotFoundError:
                pass
            except OSError as err:
                log.warning("Container GC: removing log file %s failed: %s", log_file, err)

    def _remove_log_dirs(self, names: Iterable[str], result: GCResult) -> None:
        for name in names:
            uid = log_dir_pod_uid(name)
            if uid in result.unfinished_pods:
                continue  # something of the pod is left: its logs stay until it goes
            if uid in self._existing_pods():
                continue  # the pod came back since the plan was made
            path = self._pod_logs_dir / name
            try:
                # A few small files per container: inline, as the pod worker's teardown does.
                shutil.rmtree(path)
            except FileNotFoundError:
                continue
            except OSError as err:
                log.warning("Container GC: removing pod log directory %s failed: %s", path, err)
                result.failed += 1
                continue
            log.info("Container GC: removed log directory %s of a pod that is gone", path)
            result.log_dirs += 1

    async def _sweep_pod_cgroups(self, in_runtime: set[str], result: GCResult) -> None:
        """Remove pod cgroups no pod owns (Go's cleanupOrphanedPodCgroups).

        Removing a cgroup kills what runs in it, so only once every source has reported
        (a pod not reported yet may be one being adopted), and never for a pod the
        runtime still holds something of (its teardown stops it with grace first).
        """
        qos = self._qos
        if qos is None or not self._sources_ready():
            return
        try:
            orphans = await qos.orphans({*self._existing_pods(), *in_runtime})
        except CgroupError as err:
            log.warning("Container GC: listing pod cgroups failed: %s", err)
            return
        for uid in orphans:
            if uid in self._existing_pods():
                continue
            log.info("Removing the cgroups of pod %s, which no pod owns", uid)
            try:
                await qos.remove_pod(uid)
            except CgroupError as err:
                log.warning("Removing orphaned pod cgroup %s failed: %s", uid, err)
                result.failed += 1
            else:
                result.cgroups += 1


def _by_sandbox(plan: GCPlan) -> tuple[dict[str, list[GCContainer]], list[GCContainer]]:
    """The planned containers that go with their sandbox (also planned), and the rest.

    A container in an unknown state is removed on its own, stopped first.
    """
    doomed = {s.id for s in plan.sandboxes}
    with_sandbox: dict[str, list[GCContainer]] = {}
    alone = []
    for c in plan.containers:
        if c.sandbox_id in doomed and c.state is not ContainerState.UNKNOWN:
            with_sandbox.setdefault(c.sandbox_id, []).append(c)
        else:
            alone.append(c)
    return with_sandbox, alone


def listed_container(c: upb.Container) -> GCContainer:
    """A container as ListContainers gives it, its log path worked out from its labels."""
    labels, meta, created_at = c.labels, c.metadata, c.created_at
    uid, name = labels.get(POD_UID, ""), meta.name or labels.get(CONTAINER_NAME, "")
    pod, namespace = labels.get(POD_NAME), labels.get(POD_NAMESPACE)
    restarts = c.annotations.get(RESTART_COUNT, "")
    log_path = ""
    if uid and pod and namespace and name and restarts.isdigit():
        # Where the agent (and the Go kubelet) put it: no ContainerStatus call per container.
        log_path = f"{namespace}_{pod}_{uid}/{container_log_path(name, int(restarts))}"
    return GCContainer(
        id=c.id,
        pod_uid=uid,
        name=name,
        state=_CONTAINER_STATES.get(c.state, ContainerState.UNKNOWN),
        created_at=created_at / 1e9 if created_at else 0.0,
        attempt=meta.attempt,
        sandbox_id=c.pod_sandbox_id,
        log_path=log_path,
    )


def _gc_sandbox(s: upb.PodSandbox) -> GCSandbox:
    created_at = s.created_at
    return GCSandbox(
        id=s.id,
        pod_uid=s.labels.get(POD_UID, ""),
        state=SandboxState.READY if s.state == upb.SANDBOX_READY else SandboxState.NOTREADY,
        created_at=created_at / 1e9 if created_at else 0.0,
        attempt=s.metadata.attempt,
    )


def _pod_log_dirs(pod_logs_dir: Path) -> list[str]:
    """The directory names under the pod logs directory (none if it does not exist)."""
    try:
        with os.scandir(pod_logs_dir) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []

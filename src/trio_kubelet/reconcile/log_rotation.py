"""Container log rotation: every 10 s, the running containers' CRI logs past
containerLogMaxSize are rotated as ``core.log_rotation`` plans it.

The logs are found from one ListContainers (their paths follow from the labels, as the
container GC finds them) and a stat each, so a node at rest makes no call per container.
Compression runs in a worker thread. If the runtime cannot reopen the log after the
rename, the rename is undone and the next round tries again, as the Go kubelet does.
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import trio

from trio_kubelet.core.log_rotation import (
    COMPRESSED_SUFFIX,
    ROTATED_STAMP,
    TEMPORARY_SUFFIX,
    RotationPlan,
    RotationPolicy,
)
from trio_kubelet.core.observed import ContainerState
from trio_kubelet.reconcile.container_gc import listed_container
from trio_kubelet.recording.node_decisions import LogRotation
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError

__all__ = ["LOG_MONITOR_PERIOD", "ContainerLogRotation"]

log = logging.getLogger("trio_kubelet.log_rotation")

LOG_MONITOR_PERIOD = 10.0  # the Go kubelet's containerLogMonitorInterval default
_RUNNING = v1.ContainerFilter(
    state=v1.ContainerStateValue(state=v1.ContainerState.CONTAINER_RUNNING)
)


class ContainerLogRotation:
    """The rotation task; ``clock`` is wall time (epoch seconds), for the rotated names."""

    def __init__(
        self,
        client: CRIClient,
        policy: RotationPolicy,
        *,
        pod_logs_dir: Path,
        clock: Callable[[], float],
        period: float = LOG_MONITOR_PERIOD,
        recorder: Recorder | None = None,
    ) -> None:
        self._client = client
        self.policy = policy
        self._pod_logs_dir = pod_logs_dir
        self._clock = clock
        self._period = period
        self._recorder = recorder

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self.policy.enabled:
            return
        while True:
            try:
                await self.rotate_logs()
            except CRIError as err:
                log.warning("Container log rotation: listing the running containers failed: %s",
                            err)
            except Exception:  # a bug here must not take the agent down; try next period
                log.exception("Container log rotation failed")
            await trio.sleep(self._period)

    async def rotate_logs(self) -> int:
        """One round over the running containers; how many logs it rotated."""
        rotated = 0
        for container in map(listed_container, await self._client.list_containers_brief(_RUNNING)):
            if container.state is not ContainerState.RUNNING or not container.log_path:
                continue
            try:
                rotated += await self._rotate(container.id, container.log_path)
            except (OSError, CRIError) as err:
                log.warning("Failed to rotate the log %s of container %s: %s",
                            container.log_path, container.id, err)
        return rotated

    async def _rotate(self, container_id: str, relative: str) -> bool:
        path = self._pod_logs_dir / relative
        try:
            size = path.stat().st_size
        except FileNotFoundError:  # removed under the runtime: have it write a new one
            await self._client.reopen_container_log(container_id)
            return False
        if size < self.policy.max_size:
            return False
        stamp = time.strftime(ROTATED_STAMP, time.localtime(self._clock()))
        plan = LogRotation.decide(self._recorder, relative, size, os.listdir(path.parent),
                                  self.policy, stamp)
        if plan is None:
            return False
        await trio.to_thread.run_sync(_tidy, path.parent, plan)
        rotated = path.with_name(plan.rotate_to)
        path.rename(rotated)
        try:
            await self._client.reopen_container_log(container_id)
        except CRIError:
            rotated.rename(path)  # the runtime still writes here: try again next round
            raise
        log.info("Rotated the log %s of container %s (%d bytes) to %s", relative,
                 container_id[:13], size, plan.rotate_to)
        return True


def _tidy(directory: Path, plan: RotationPlan) -> None:
    """Remove and compress what the plan says (blocking: run in a thread)."""
    for name in plan.remove:
        (directory / name).unlink(missing_ok=True)
    for name in plan.compress:
        source = directory / name
        temporary = directory / (name + TEMPORARY_SUFFIX)
        try:
            with source.open("rb") as plain, gzip.open(temporary, "wb") as packed:
                shutil.copyfileobj(plain, packed)
            os.chmod(temporary, source.stat().st_mode & 0o777)
            temporary.rename(directory / (name + COMPRESSED_SUFFIX))
        finally:
            temporary.unlink(missing_ok=True)
        source.unlink()

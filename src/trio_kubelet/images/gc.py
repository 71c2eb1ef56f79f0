"""Image garbage collection (shell): every 5 minutes, and when the eviction manager asks.

Each pass lists the runtime's images and containers, updates the per-image records
(first detected, last used), asks ``core.image_gc`` what to remove, and removes it
through CRI RemoveImage. The image filesystem's size and free space come from
statvfs of the mount point the runtime reports in ImageFsInfo, as the sampler reads
them. A pass that cannot free what the thresholds ask for reports
``FreeDiskSpaceFailed`` on the node; two failed passes in a row, ``ImageGCFailed``.

The sandbox (pause) image is never removed: containerd before 1.7 does not mark it
pinned, so the pass asks the runtime's status for its configured ``sandboxImage``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from trio_kubelet.config import KubeletConfiguration
from trio_kubelet.core.eviction import DISK_SIGNALS
from trio_kubelet.core.image_gc import (
    ImageFs,
    ImageGCPolicy,
    ImageRecord,
    InvalidCapacity,
    ListedImage,
    RemovalReason,
    SpacePlan,
    bytes_to_free,
    choose_for_space,
    detect_images,
    eviction_order,
    expired_images,
    images_in_use,
    usage_percent,
)
from trio_kubelet.core.image_ref import InvalidImageReference, parse_image_reference
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.recording.node_decisions import ImageGCPass
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError
from trio_kubelet.sources.sampler import statvfs

log = logging.getLogger("trio_kubelet.images.gc")

IMAGE_GC_PERIOD = 300.0  # kubelet.go ImageGCPeriod
# Removals in flight at once (the Go kubelet removes one at a time): the round trips overlap.
REMOVAL_CONCURRENCY = 8

ImageFsReader = Callable[[], Awaitable[ImageFs | None]]


class ImageGCRuntime(Protocol):
    """The CRI calls image GC makes (`CRIClient` has them)."""

    async def list_images(self, *, call_timeout: float | None = None) -> list[v1.Image]: ...

    async def list_containers_brief(self, *, call_timeout: float | None = None
                                    ) -> Sequence[Any]: ...

    async def remove_images(self, refs: Sequence[str], *,
                            concurrency: int) -> list[CRIError | None]: ...

    async def image_fs_info(self, *, call_timeout: float | None = None
                            ) -> v1.ImageFsInfoResponse: ...

    async def status(self, *, verbose: bool = False, call_timeout: float | None = None
                     ) -> v1.StatusResponse: ...


class ImageGCError(Exception):
    """A pass could not do its job; the message says why (and is the ImageGCFailed event)."""


@dataclass(frozen=True, slots=True)
class GCResult:
    """What one pass did."""

    removed: tuple[ImageRecord, ...] = ()
    freed_bytes: int = 0
    needed_bytes: int = 0
    usage_percent: int | None = None


class ImageGC:
    """The image garbage collector of one node; `run` is its periodic task."""

    def __init__(
        self,
        client: ImageGCRuntime,
        policy: ImageGCPolicy,
        *,
        node_name: str = "",
        events: EventRecorder | None = None,
        metrics: AgentMetrics | None = None,
        image_fs: ImageFsReader | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._client = client
        self.policy = policy
        self._node_name = node_name
        self._events = events if events is not None else EventRecorder()
        self._metrics = metrics
        self._recorder = recorder
        self._image_fs = image_fs if image_fs is not None else self._statvfs_image_fs
        self._image_fs_path: Path | None = None
        self._records: dict[str, ImageRecord] = {}
        self._used_at: dict[str, float] = {}
        self._detected = False
        self._started_at: float | None = None
        self._lock = trio.Lock()

    @property
    def records(self) -> dict[str, ImageRecord]:
        """The per-image records as of the last pass (a copy)."""
        return dict(self._records)

    def note_used(self, image_id: str) -> None:
        """A container is about to use ``image_id`` (the image manager calls this)."""
        self._used_at[image_id] = trio.current_time()

    async def run(
        self,
        *,
        period: float | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """A pass now and then every ``period`` (default `IMAGE_GC_PERIOD`) seconds.

        With imageGCHighThresholdPercent 100 and no imageMaximumGCAge no periodic pass
        can act, so none runs (as in the Go kubelet); `reclaim` still works.
        """
        self._started_at = trio.current_time()
        task_status.started()
        if not self.policy.periodic_gc_enabled:
            log.info("Image garbage collection is off: imageGCHighThresholdPercent is 100")
            return
        failed_before = False
        while True:
            try:
                await self.collect()
            except Exception as err:  # a failed pass must not stop the agent
                if not isinstance(err, ImageGCError):
                    log.exception("Image garbage collection failed unexpectedly")
                if failed_before:
                    log.error("Image garbage collection failed again: %s", err)
                    self._node_event("ImageGCFailed", str(err))
                else:
                    log.error("Image garbage collection failed: %s", err)
                failed_before = True
            else:
                failed_before = False
            await trio.sleep(period if period is not None else IMAGE_GC_PERIOD)

    async def collect(self) -> GCResult:
        """One periodic pass: age removals, then free space down to the low threshold."""
        async with self._lock:
            now = trio.current_time()
            started_at = self._started_at if self._started_at is not None else now
            order, in_use = await self._detect(now)
            expired = expired_images(order, now, self.policy, started_at)
            removed, failures = await self._remove_all(expired, "age")
            fs = await self._read_image_fs()
            try:
                usage = usage_percent(fs)
                needed = bytes_to_free(fs, self.policy)
            except InvalidCapacity as err:
                self._node_event("InvalidDiskCapacity", str(err))
                raise ImageGCError(str(err)) from None
            if needed <= 0:
                if expired:
                    self._record(now, started_at, in_use, fs, expired, removed, ())
                self._raise_for(failures)
                return GCResult(tuple(removed), 0, 0, usage)
            log.info(
                "Image filesystem usage is %d%%, at or over the high threshold (%d%%): "
                "freeing %d bytes to get down to the low threshold (%d%%)",
                usage, self.policy.high_threshold_percent, needed,
                self.policy.low_threshold_percent,
            )
            gone = {r.id for r in removed}
            plan = choose_for_space([r for r in order if r.id not in gone], needed, now,
                                    self.policy)
            self._record(now, started_at, in_use, fs, expired, removed, plan.removals)
            freed_records, more_failures = await self._free(plan)
            freed = sum(r.size for r in freed_records)
            if freed < needed:
                message = (
                    f"Image garbage collection had to free {needed} bytes but could free only "
                    f"{freed} bytes: no other image is unused, unpinned and old enough"
                )
                if more_failures or failures:
                    message += f" ({_describe(failures + more_failures)})"
                log.warning("%s", message)
                self._node_event("FreeDiskSpaceFailed", message)
                raise ImageGCError(message)
            self._raise_for(failures + more_failures)
            return GCResult(tuple(removed + freed_records), freed, needed, usage)

    async def reclaim(self, signal: str) -> None:
        """Node-level reclaim under disk pressure: remove every unused image old enough.

        The eviction manager calls this before it evicts pods for a disk signal; it
        re-measures afterwards, so failures are logged, not raised.
        """
        if signal not in DISK_SIGNALS:
            log.debug("Image garbage collection cannot relieve %s", signal)
            return
        async with self._lock:
            now = trio.current_time()
            try:
                order, in_use = await self._detect(now)
            except ImageGCError as err:
                log.warning("Reclaiming images for %s failed: %s", signal, err)
                return
            plan = choose_for_space(order, math.inf, now, self.policy)
            if plan.removals:
                self._record(now, now, in_use, None, (), (), plan.removals)
            removed, failures = await self._free(plan)
        freed = sum(r.size for r in removed)
        log.info("Reclaimed %d bytes for %s by removing %d unused images%s", freed, signal,
                 len(removed), f" ({_describe(failures)})" if failures else "")

    # -- the steps of a pass --------------------------------------------------------------------

    async def _detect(self, now: float) -> tuple[list[ImageRecord], frozenset[str]]:
        """List images and containers, update the records; the eviction order, the IDs in use."""
        try:
            images = await self._client.list_images()
            containers = await self._client.list_containers_brief()
        except CRIError as err:
            raise ImageGCError(f"listing images and containers failed: {err}") from err
        sandbox = await self._sandbox_image_refs()
        listed = [_listed(image, sandbox) for image in images]
        named = {ref for c in containers for ref in _container_image_refs(c)}
        # A runtime may name a container's image by a short name ("busybox:1.36"): match
        # its normalised forms against the images' tags too.
        references = set(named).union(
            *(_reference_forms(ref) for ref in named if not ref.startswith("sha256:")))
        in_use = images_in_use(listed, references)
        self._records = detect_images(
            self._records, listed, in_use, now, used_at=self._used_at, first_pass=not self._detected
        )
        self._detected = True
        self._used_at.clear()
        return eviction_order(self._records.values(), in_use), in_use

    def _record(
        self,
        now: float,
        started_at: float,
        in_use: frozenset[str],
        fs: ImageFs | None,
        expired: Sequence[ImageRecord],
        removed_by_age: Sequence[ImageRecord],
        removals: Sequence[ImageRecord],
    ) -> None:
        """A pass's choices with their inputs (``fs`` None: a reclaim). The images as the
        pass detected them: the age removals have already dropped their records."""
        ImageGCPass.recorded(
            self._recorder, now=now, started_at=started_at,
            detected=[*self._records.values(), *removed_by_age], in_use=in_use, image_fs=fs,
            expired=expired, removed_by_age=removed_by_age, removals=removals,
        )

    async def _free(self, plan: SpacePlan) -> tuple[list[ImageRecord], list[str]]:
        """Remove the plan's images; when one fails, take the next spare until enough is freed."""
        removed, failures = await self._remove_all(plan.removals, "space")
        spare = list(plan.spare)
        freed = sum(r.size for r in removed)
        while failures and freed < plan.needed and spare:
            record = spare.pop(0)
            done, failed = await self._remove_all([record], "space")
            removed += done
            failures += failed
            freed += sum(r.size for r in done)
        return removed, failures

    async def _remove_all(
        self, records: Sequence[ImageRecord], reason: RemovalReason
    ) -> tuple[list[ImageRecord], list[str]]:
        """Remove ``records`` in one burst, ``REMOVAL_CONCURRENCY`` at a time: the removed
        ones in order, and a line for each failure."""
        why = "to free space" if reason == "space" else "unused for longer than imageMaximumGCAge"
        for record in records:
            name = record.tags[0] if record.tags else record.id
            log.info("Removing image %s (%s, %d bytes) %s", name, record.id, record.size, why)
        errors = await self._client.remove_images(
            [r.id for r in records], concurrency=REMOVAL_CONCURRENCY)
        removed, failures = [], []
        for record, error in zip(records, errors, strict=True):
            if error is not None:
                log.warning("Removing image %s failed: %s", record.id, error)
                failures.append(f"{record.id}: {error}")
                continue
            self._records.pop(record.id, None)
            if self._metrics is not None:
                self._metrics.image_garbage_collected.labels(reason).inc()
            removed.append(record)
        return removed, failures

    async def _read_image_fs(self) -> ImageFs:
        try:
            fs = await self._image_fs()
        except CRIError as err:
            raise ImageGCError(f"reading the image filesystem failed: {err}") from err
        if fs is None:
            raise ImageGCError("the image filesystem's size is unknown")
        return fs

    async def _statvfs_image_fs(self) -> ImageFs | None:
        """statvfs of the runtime's image filesystem (its mount point asked once)."""
        if self._image_fs_path is None:
            info = await self._client.image_fs_info()
            mounts = [fs.fs_id.mountpoint for fs in info.image_filesystems
                      if fs.fs_id is not None and fs.fs_id.mountpoint]
            if not mounts:
                return None
            self._image_fs_path = Path(mounts[0])
        figures = await trio.to_thread.run_sync(statvfs, self._image_fs_path)
        if figures is None:
            return None
        return ImageFs(figures.capacity_bytes, figures.available_bytes)

    async def _sandbox_image_refs(self) -> frozenset[str]:
        """Every way a container or image list may name the runtime's sandbox image."""
        try:
            status = await self._client.status(verbose=True)
            config = json.loads(status.info.get("config", "{}"))
        except (CRIError, ValueError):
            return frozenset()
        image = config.get("sandboxImage") if isinstance(config, dict) else None
        return _reference_forms(image) if isinstance(image, str) and image else frozenset()

    def _node_event(self, reason: str, message: str) -> None:
        self._events.node_event(self._node_name, "Warning", reason, message)

    @staticmethod
    def _raise_for(failures: Sequence[str]) -> None:
        if failures:
            raise ImageGCError(f"removing images failed: {_describe(failures)}")


def _describe(failures: Sequence[str]) -> str:
    shown = "; ".join(failures[:3])
    return shown + (f"; and {len(failures) - 3} more" if len(failures) > 3 else "")


def _reference_forms(ref: str) -> frozenset[str]:
    """``ref`` as written and fully normalised (``pause:3.9`` → ``docker.io/library/pause:3.9``)."""
    forms = {ref}
    try:
        parsed = parse_image_reference(ref)
    except InvalidImageReference:
        return frozenset(forms)
    forms.add(str(parsed))
    if parsed.tag is None and parsed.digest is None:
        forms.add(f"{parsed}:latest")
    return frozenset(forms)


def _listed(image: v1.Image, sandbox: frozenset[str]) -> ListedImage:
    tags = tuple(image.repo_tags)
    pinned = image.pinned or not sandbox.isdisjoint(tags) or image.id in sandbox
    return ListedImage(image.id, image.size, pinned, tags, tuple(image.repo_digests))


def _container_image_refs(container: Any) -> Iterable[str]:
    """The image names a listed container carries: the image ID, and the spec it asked for."""
    for ref in (container.image_ref, getattr(container, "image_id", ""),
                container.image.image if container.HasField("image") else ""):
        if ref:
            yield ref


def image_gc_policy(config: KubeletConfiguration) -> ImageGCPolicy:
    """The image GC settings of a KubeletConfiguration."""
    return ImageGCPolicy(
        high_threshold_percent=config.image_gc_high_threshold_percent,
        low_threshold_percent=config.image_gc_low_threshold_percent,
        minimum_age=config.image_minimum_gc_age,
        maximum_age=config.image_maximum_gc_age,
    )

"""Image garbage collection as pure choices: which images to remove, in which order.

The Go kubelet's image GC, restated. The shell (``images/gc.py``) lists the images
and containers and reads the image filesystem; these functions keep the per-image
records (first detected, last used) and choose:

* **by age** (``imageMaximumGCAge``, 0 = off): every unused image not used for longer
  than the maximum age — once the agent itself has run that long, so a restart does
  not count the time it was down as disuse;
* **by space**: when the image filesystem's usage reaches ``imageGCHighThresholdPercent``,
  unused images, least recently used first (ties: detected first), until usage would be
  back at ``imageGCLowThresholdPercent``.

"Unused" means no container the runtime knows — running or exited — refers to it, and
it is not pinned (the runtime's pinned flag, or the sandbox image). An image detected
less than ``imageMinimumGCAge`` ago is never removed for space: it may have just been
pulled for a container about to be created. Times are seconds on one monotonic clock;
an image present when the agent started counts as detected long ago (``NEVER``), and
one never used has ``last_used == NEVER``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Literal

NEVER = -math.inf

DEFAULT_HIGH_THRESHOLD_PERCENT = 85
DEFAULT_LOW_THRESHOLD_PERCENT = 80
DEFAULT_MINIMUM_AGE = 120.0

RemovalReason = Literal["age", "space"]


@dataclass(frozen=True, slots=True)
class ImageGCPolicy:
    """KubeletConfiguration's image GC settings (percentages of the image filesystem)."""

    high_threshold_percent: int = DEFAULT_HIGH_THRESHOLD_PERCENT
    low_threshold_percent: int = DEFAULT_LOW_THRESHOLD_PERCENT
    minimum_age: float = DEFAULT_MINIMUM_AGE
    maximum_age: float = 0.0

    @property
    def periodic_gc_enabled(self) -> bool:
        """False when the periodic pass can never act: high threshold 100 and no max age."""
        return self.high_threshold_percent < 100 or self.maximum_age > 0


@dataclass(frozen=True, slots=True)
class ListedImage:
    """An image as the runtime lists it."""

    id: str
    size: int
    pinned: bool = False
    tags: tuple[str, ...] = ()
    digests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ImageRecord:
    """What GC knows of an image: the runtime's facts plus when it was detected and used."""

    id: str
    size: int
    pinned: bool
    first_detected: float
    last_used: float = NEVER
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ImageFs:
    """The image filesystem's size and free space (for unprivileged users), in bytes."""

    capacity_bytes: int
    available_bytes: int


class InvalidCapacity(ValueError):
    """The image filesystem reports no capacity: usage cannot be computed."""


def images_in_use(listed: Iterable[ListedImage], references: Set[str]) -> frozenset[str]:
    """The IDs of listed images that ``references`` (containers' image fields) name.

    Containers name their image by ID (containerd's ``image_ref``), by tag or by digest;
    all three are matched.
    """
    used: set[str] = set()
    for image in listed:
        if (
            image.id in references
            or not references.isdisjoint(image.tags)
            or not references.isdisjoint(image.digests)
        ):
            used.add(image.id)
    return frozenset(used)


def detect_images(
    records: Mapping[str, ImageRecord],
    listed: Iterable[ListedImage],
    in_use: Set[str],
    now: float,
    *,
    used_at: Mapping[str, float] | None = None,
    first_pass: bool = False,
) -> dict[str, ImageRecord]:
    """The records after a listing: new images recorded, used ones stamped, gone ones dropped.

    ``in_use`` holds the IDs containers use now (last used = ``now``); ``used_at`` extra
    last-use times reported between passes (the image manager's). On the ``first_pass``
    images already present count as detected long ago, as the Go kubelet's first
    detection does.
    """
    detected_at = NEVER if first_pass else now
    reported = used_at or {}
    updated: dict[str, ImageRecord] = {}
    for image in listed:
        old = records.get(image.id)
        last_used = max(old.last_used if old else NEVER, reported.get(image.id, NEVER))
        if image.id in in_use:
            last_used = now
        updated[image.id] = ImageRecord(
            id=image.id,
            size=image.size,
            pinned=image.pinned,
            first_detected=old.first_detected if old else detected_at,
            last_used=last_used,
            tags=image.tags,
        )
    return updated


def eviction_order(records: Iterable[ImageRecord], in_use: Set[str]) -> list[ImageRecord]:
    """The images GC may consider, least recently used first (ties: detected first)."""
    candidates = [r for r in records if r.id not in in_use and not r.pinned]
    candidates.sort(key=lambda r: (r.last_used, r.first_detected, r.id))
    return candidates


def unused_since(record: ImageRecord) -> float:
    """Since when the image has gone unused: its last use, or its detection if never used."""
    return record.last_used if record.last_used != NEVER else record.first_detected


def expired_images(
    order: Sequence[ImageRecord], now: float, policy: ImageGCPolicy, started_at: float
) -> list[ImageRecord]:
    """Images unused for longer than ``maximum_age`` (none while the agent is younger)."""
    if policy.maximum_age <= 0 or now - started_at <= policy.maximum_age:
        return []
    return [r for r in order if now - unused_since(r) > policy.maximum_age]


def usage_percent(fs: ImageFs) -> int:
    """Whole percent used, as the Go kubelet counts it: 100 - floor(available*100/capacity)."""
    if fs.capacity_bytes <= 0:
        raise InvalidCapacity(f"invalid capacity {fs.capacity_bytes} on image filesystem")
    available = min(fs.available_bytes, fs.capacity_bytes)
    return 100 - (max(available, 0) * 100) // fs.capacity_bytes


def bytes_to_free(fs: ImageFs, policy: ImageGCPolicy) -> int:
    """How much to free to bring usage down to the low threshold (0 below the high one)."""
    if usage_percent(fs) < policy.high_threshold_percent:
        return 0
    available = min(fs.available_bytes, fs.capacity_bytes)
    target = fs.capacity_bytes * (100 - policy.low_threshold_percent) // 100
    return max(target - available, 0)


def removable_for_space(record: ImageRecord, now: float, policy: ImageGCPolicy) -> bool:
    """Old enough, and not used at (or after) the moment of the pass."""
    return record.last_used < now and now - record.first_detected >= policy.minimum_age


@dataclass(frozen=True, slots=True)
class SpacePlan:
    """The images to remove to free ``needed`` bytes, and those to try if a removal fails."""

    needed: int
    removals: tuple[ImageRecord, ...]
    spare: tuple[ImageRecord, ...]

    @property
    def freed(self) -> int:
        return sum(r.size for r in self.removals)

    @property
    def shortfall(self) -> int:
        """Bytes still missing after every chosen removal (0: enough was found)."""
        return max(self.needed - self.freed, 0)


def choose_for_space(
    order: Sequence[ImageRecord], needed: float, now: float, policy: ImageGCPolicy
) -> SpacePlan:
    """Walk ``order`` removing eligible images until ``needed`` bytes are freed.

    ``needed`` may be ``math.inf`` (free everything eligible: the eviction manager's
    node-level reclaim).
    """
    eligible = [r for r in order if removable_for_space(r, now, policy)]
    chosen: list[ImageRecord] = []
    freed = 0
    if needed > 0:
        for record in eligible:
            chosen.append(record)
            freed += record.size
            if freed >= needed:
                break
    rest = eligible[len(chosen):]
    whole = needed if math.isfinite(needed) else sum(r.size for r in eligible)
    return SpacePlan(int(whole), tuple(chosen), tuple(rest))


@dataclass(frozen=True, slots=True)
class ImageGCPlan:
    """One whole pass as the pure functions see it (for tests and benchmarks)."""

    expired: tuple[ImageRecord, ...]
    space: SpacePlan
    usage_percent: int

    @property
    def removals(self) -> tuple[tuple[ImageRecord, RemovalReason], ...]:
        aged: tuple[tuple[ImageRecord, RemovalReason], ...] = tuple(
            (r, "age") for r in self.expired
        )
        return aged + tuple((r, "space") for r in self.space.removals)


def plan_image_gc(
    records: Mapping[str, ImageRecord],
    in_use: Set[str],
    fs: ImageFs,
    now: float,
    policy: ImageGCPolicy,
    started_at: float,
) -> ImageGCPlan:
    """A whole pass at once, assuming each age removal frees its image's size.

    The shell runs the two steps apart instead (it reads the filesystem again after
    the age removals); this is the same choice for callers without a filesystem.
    """
    order = eviction_order(records.values(), in_use)
    expired = expired_images(order, now, policy, started_at)
    gone = {r.id for r in expired}
    after = ImageFs(fs.capacity_bytes, fs.available_bytes + sum(r.size for r in expired))
    remaining = [r for r in order if r.id not in gone]
    space = choose_for_space(remaining, bytes_to_free(after, policy), now, policy)
    return ImageGCPlan(tuple(expired), space, usage_percent(fs))

"""Container log rotation: which files one rotation removes, compresses and renames.

The Go kubelet's rules (containerLogMaxSize, containerLogMaxFiles): a running container's
log that has reached the maximum size is renamed to ``<log>.<YYYYmmdd-HHMMSS>`` and the
runtime reopens the original name. Before that, leftovers of an interrupted rotation go
(``.tmp`` files, and a rotated file whose ``.gz`` exists), the oldest rotated files go so
that, with the live log and the one about to be rotated, at most containerLogMaxFiles
remain, and every rotated file left is gzip-compressed. The newest rotated file stays
plain, so a reader that follows it by name (``kubectl logs -f``, a log shipper) can finish.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

__all__ = [
    "COMPRESSED_SUFFIX",
    "ROTATED_STAMP",
    "TEMPORARY_SUFFIX",
    "RotationPlan",
    "RotationPolicy",
    "plan_rotation",
]

COMPRESSED_SUFFIX = ".gz"
TEMPORARY_SUFFIX = ".tmp"
ROTATED_STAMP = "%Y%m%d-%H%M%S"  # strftime of Go's "20060102-150405"


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    """``max_size`` in bytes (negative: never rotate), ``max_files`` counting the live log."""

    max_size: int
    max_files: int

    @property
    def enabled(self) -> bool:
        return self.max_size >= 0


@dataclass(frozen=True, slots=True)
class RotationPlan:
    """File names in the log's directory, acted on in this order."""

    remove: tuple[str, ...]
    compress: tuple[str, ...]
    rotate_to: str


def plan_rotation(
    log: str, size: int, siblings: Collection[str], policy: RotationPolicy, stamp: str
) -> RotationPlan | None:
    """The rotation of the live log named ``log`` of ``size`` bytes, given the names in its
    directory; None while it is under the maximum size (or rotation is off, or a file of
    the new name exists: a second rotation within the same second waits for the next).
    """
    if not policy.enabled or size < policy.max_size:
        return None
    rotate_to = f"{log}.{stamp}"
    rotated = sorted(name for name in siblings if name.startswith(f"{log}."))
    if rotate_to in rotated:
        return None
    present = set(rotated)
    leftovers = [
        name
        for name in rotated
        if name.endswith(TEMPORARY_SUFFIX)
        or (not name.endswith(COMPRESSED_SUFFIX) and name + COMPRESSED_SUFFIX in present)
    ]
    kept = [name for name in rotated if name not in leftovers]
    excess = len(kept) - max(policy.max_files - 2, 0)
    removed = kept[: max(excess, 0)]
    kept = kept[len(removed):]
    return RotationPlan(
        remove=(*leftovers, *removed),
        compress=tuple(name for name in kept if not name.endswith(COMPRESSED_SUFFIX)),
        rotate_to=rotate_to,
    )

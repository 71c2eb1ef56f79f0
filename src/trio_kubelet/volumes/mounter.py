"""mount(2) and umount(2) for volumes, and what /proc/self/mountinfo says is mounted.

System calls through libc rather than the ``mount`` binary: the options are few and
fixed, and no util-linux is needed on the node.
"""

from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path

_MS_BIND = 0x1000
_MOUNTINFO = "/proc/self/mountinfo"
_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def mount_tmpfs(target: Path, size: int | None) -> None:
    """A tmpfs on ``target``; without a size the kernel's default (half of RAM) applies."""
    options = f"size={size}".encode() if size else None
    _check(_libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", 0, options), target)


def bind_mount(source: str, target: Path) -> None:
    """Bind ``source`` (a path, or ``/proc/self/fd/N`` of an open file) onto ``target``."""
    _check(_libc.mount(os.fsencode(source), os.fsencode(target), None, _MS_BIND, None), target)


def unmount(target: Path) -> None:
    """Unmount ``target``; a busy mount is an error, never lazily detached."""
    _check(_libc.umount2(os.fsencode(target), 0), target)


def mount_points_under(root: Path) -> list[Path]:
    """Mount points at or below ``root`` (symlinks resolved), in the order to unmount them.

    Deepest first, and a path mounted over several times once per mount, newest first.
    """
    top = os.path.realpath(root)
    found = [
        point
        for point, _ in reversed(_mounts())
        if point == top or point.startswith(top.rstrip("/") + "/")
    ]
    found.sort(key=lambda point: point.count("/"), reverse=True)
    return [Path(point) for point in found]


def fs_type(path: Path) -> str | None:
    """The file system type mounted at exactly ``path`` (the top one), None if no mount."""
    point = os.path.realpath(path)
    types = [kind for mounted, kind in _mounts() if mounted == point]
    return types[-1] if types else None


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) for every mount of this namespace, in mount order."""
    with open(_MOUNTINFO, "rb") as file:
        lines = file.read().splitlines()
    mounts = []
    for line in lines:
        fields, _, tail = line.partition(b" - ")
        point = _OCTAL_ESCAPE.sub(lambda m: bytes([int(m[1], 8)]), fields.split(b" ")[4])
        mounts.append((os.fsdecode(point), os.fsdecode(tail.split(b" ")[0])))
    return mounts


def _check(result: int, target: Path) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), str(target))

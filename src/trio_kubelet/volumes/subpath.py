"""Safe subPath preparation: the Go kubelet's defence against symlinks out of a volume.

A container that can write to a volume can plant symlinks in it. So a subPath is
resolved, must stay inside the volume, and is then opened one component at a time
without following symlinks; that open file is bind-mounted at
``<pod>/volume-subpaths/<volume>/<container>/<index>`` and the runtime is given the
bind mount. Swapping a component for a symlink after the check changes nothing: the
mount holds the checked file itself (CVE-2017-1002101).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path, PurePosixPath

from trio_kubelet.volumes import mounter

_OPEN_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeSubPath(Exception):
    """The subPath leaves its volume, or was changed into a symlink while being opened."""


def make_subpath_dirs(volume_path: Path, sub_path: str) -> None:
    """Create the missing directories of ``sub_path`` inside the volume (Go's SafeMakeDir).

    They get the volume directory's mode, so an fsGroup's setgid and group bits carry
    over instead of whatever the runtime would give a directory it creates.
    """
    base = os.path.realpath(volume_path)
    mode = stat.S_IMODE(os.stat(volume_path).st_mode)
    parts = PurePosixPath(sub_path).parts
    existing = str(volume_path)
    done = 0
    for part in parts:
        if not os.path.exists(os.path.join(existing, part)):
            break
        existing = os.path.join(existing, part)
        done += 1
    fd = _open_beneath(base, os.path.realpath(existing))
    try:
        for part in parts[done:]:
            # Made meanwhile? Opening it without following links still checks it.
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, mode & 0o777, dir_fd=fd)
            child = os.open(part, _OPEN_DIR, dir_fd=fd)
            os.close(fd)
            fd = child
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def bind_subpath(volume_path: Path, sub_path: str, target: Path) -> Path:
    """Bind-mount the checked ``sub_path`` of the volume at ``target`` and return ``target``.

    A target still mounted from an earlier start of the container is kept when it is
    the same file, and replaced otherwise.
    """
    base = os.path.realpath(volume_path)
    fd = _open_beneath(base, os.path.realpath(os.path.join(volume_path, sub_path)))
    try:
        opened = os.fstat(fd)
        if mounter.fs_type(target) is not None:
            mounted = os.stat(target)
            if (mounted.st_dev, mounted.st_ino) == (opened.st_dev, opened.st_ino):
                return target
            mounter.unmount(target)
        _make_target(target, directory=stat.S_ISDIR(opened.st_mode))
        mounter.bind_mount(f"/proc/self/fd/{fd}", target)
    finally:
        os.close(fd)
    return target


def _open_beneath(base: str, resolved: str) -> int:
    """An O_PATH descriptor of ``resolved``, reached from ``base`` without following links."""
    if os.path.commonpath([base, resolved]) != base:
        raise UnsafeSubPath(f"{resolved} is not within the volume {base}")
    fd = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in PurePosixPath(os.path.relpath(resolved, base)).parts:
            child = os.open(part, _OPEN_PATH, dir_fd=fd)
            os.close(fd)
            fd = child
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise UnsafeSubPath(f"{resolved}: {part} became a symlink")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _make_target(target: Path, *, directory: bool) -> None:
    """A directory for a directory, an empty file for anything else (a bind mount target)."""
    target.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    if os.path.lexists(target) and target.is_dir() != directory:
        if target.is_dir():
            target.rmdir()
        else:
            target.unlink()
    if directory:
        target.mkdir(mode=0o750, exist_ok=True)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o640))

"""Projecting a payload into a volume directory so that readers never see a half update.

The Go kubelet's AtomicWriter layout: the files live in a hidden timestamped directory
``..2024_05_01_12_00_00.123456``, ``..data`` is a symlink to it, and every top-level
name the user sees is a symlink through it (``key -> ..data/key``). An update writes a
fresh timestamped directory and swaps ``..data`` with one rename(2), so a reader
resolves either the whole old content or the whole new one. Callers serialise writes
to one directory.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from trio_kubelet.volumes.ownership import set_volume_ownership
from trio_kubelet.volumes.projection import clean_payload

DATA_DIR = "..data"
_NEW_DATA_DIR = "..data_tmp"
_FS_GROUP_READ = 0o440  # what ownership adds to a file of a read-only volume


def write_atomically(
    target_dir: Path, payload: Mapping[str, tuple[bytes, int]], *, fs_group: int | None = None
) -> bool:
    """Make ``target_dir`` show exactly ``payload`` (path -> (content, mode)).

    Returns whether anything was written: an unchanged payload (same files, contents
    and modes) leaves the data directory alone. With ``fs_group`` the files belong to
    that group and are group-readable before they become visible.
    """
    files = clean_payload(payload)
    data_link = target_dir / DATA_DIR
    old = os.readlink(data_link) if os.path.lexists(data_link) else None
    visible = {path.split("/")[0] for path in files}
    if old is not None and _unchanged(target_dir / old, files, fs_group):
        _link_visible(target_dir, visible)  # they may have been lost (Go issue 121472)
        return False
    new = _write_new_data_dir(target_dir, files, fs_group)
    try:
        _link_visible(target_dir, visible)
        new_link = target_dir / _NEW_DATA_DIR
        if os.path.lexists(new_link):  # left by an interrupted write
            new_link.unlink()
        os.symlink(new.name, new_link)
        os.replace(new_link, data_link)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    _remove_stale(target_dir, visible, keep=new.name)
    return True


def _unchanged(
    data_dir: Path, files: Mapping[str, tuple[bytes, int]], fs_group: int | None
) -> bool:
    if not data_dir.is_dir():  # ..data points nowhere: write it again
        return False
    present: dict[str, int] = {}
    for directory, _, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(directory, name)
            present[os.path.relpath(path, data_dir)] = stat.S_IMODE(os.lstat(path).st_mode)
    if present.keys() != files.keys():
        return False
    for path, (content, mode) in files.items():
        if present[path] != _final_mode(mode, fs_group):
            return False
        if (data_dir / path).read_bytes() != content:
            return False
    return True


def _final_mode(mode: int, fs_group: int | None) -> int:
    return mode | _FS_GROUP_READ if fs_group is not None else mode


def _write_new_data_dir(
    target_dir: Path, files: Mapping[str, tuple[bytes, int]], fs_group: int | None
) -> Path:
    prefix = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime())
    new = Path(tempfile.mkdtemp(prefix=prefix, dir=target_dir))
    try:
        os.chmod(new, 0o755)  # group and others must traverse it, whatever the umask
        for path, (content, mode) in files.items():
            file = new / path
            file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "wb") as out:
                out.write(content)
                os.fchmod(out.fileno(), mode)  # the exact mode, not mode & ~umask
        for directory, subdirs, _ in os.walk(new):
            for name in subdirs:
                os.chmod(os.path.join(directory, name), 0o755)
        if fs_group is not None:  # as Go's setPerms: the whole volume, before the swap
            set_volume_ownership(target_dir, fs_group, read_only=True)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    return new


def _link_visible(target_dir: Path, names: set[str]) -> None:
    for name in names:
        link = target_dir / name
        if not os.path.lexists(link):
            os.symlink(f"{DATA_DIR}/{name}", link)


def _remove_stale(target_dir: Path, visible: set[str], *, keep: str) -> None:
    """Drop links of names no longer in the payload, then every old data directory."""
    for entry in os.scandir(target_dir):
        if entry.name.startswith(".."):
            if entry.name not in (DATA_DIR, keep) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
        elif entry.name not in visible and _is_visible_link(entry.path, entry.name):
            os.unlink(entry.path)


def _is_visible_link(path: str, name: str) -> bool:
    """Only links this writer made are removed, never a file someone else put there."""
    return os.path.islink(path) and os.readlink(path) == f"{DATA_DIR}/{name}"

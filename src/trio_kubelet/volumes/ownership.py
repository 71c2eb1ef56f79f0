"""fsGroup ownership of volume contents, as the Go kubelet's SetVolumeOwnership applies it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

_READ_WRITE = 0o660
_READ_ONLY = 0o440
_SEARCH = 0o110


def set_volume_ownership(root: Path, fs_group: int, *, read_only: bool) -> None:
    """Give ``root`` and everything below it to group ``fs_group``.

    Files gain group read (and write unless ``read_only``), directories also search and
    setgid so that files created later inherit the group. Symlinks are re-owned but
    never chmod-ed: chmod would follow them and widen the mode of their target.
    """
    _own(str(root), fs_group, read_only)
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            _own(os.path.join(directory, name), fs_group, read_only)


def _own(path: str, fs_group: int, read_only: bool) -> None:
    info = os.lstat(path)
    os.lchown(path, -1, fs_group)
    if stat.S_ISLNK(info.st_mode):
        return
    mask = _READ_ONLY if read_only else _READ_WRITE
    if stat.S_ISDIR(info.st_mode):
        mask |= stat.S_ISGID | _SEARCH
    os.chmod(path, stat.S_IMODE(info.st_mode) | mask)

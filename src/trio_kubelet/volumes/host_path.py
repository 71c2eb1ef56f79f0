"""hostPath volumes: the node's own path, checked (or created) according to its type.

As the Go kubelet's hostPath plugin: an unset type is not checked at all; the
``...OrCreate`` types create what is missing (a 0755 directory with its parents, or
an empty 0644 file whose parent must already exist), the others must find the kind
of file they name. Symlinks are followed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from trio_kubelet.volumes.errors import FAILED_MOUNT, VolumeError

_KINDS: dict[str, tuple[str, str]] = {  # type -> (file type it must be, description)
    "DirectoryOrCreate": ("Directory", "directory"),
    "Directory": ("Directory", "directory"),
    "FileOrCreate": ("File", "file"),
    "File": ("File", "file"),
    "Socket": ("Socket", "socket file"),
    "CharDevice": ("CharDevice", "character device"),
    "BlockDevice": ("BlockDevice", "block device"),
}


def set_up_host_path(source: Mapping[str, Any]) -> None:
    """Check (or create) the host path as its ``type`` asks; the path itself is mounted."""
    path = str(source.get("path", ""))
    path_type = str(source.get("type") or "")
    if ".." in path.split("/"):
        raise VolumeError(FAILED_MOUNT, f"invalid HostPath `{path}`: must not contain '..'")
    if path_type and path_type not in _KINDS:
        raise VolumeError(FAILED_MOUNT, f"{path_type} is an invalid volume type")
    if path_type and not (path_type.endswith("OrCreate") and _create(path, path_type)):
        _check_type(path, *_KINDS[path_type])


def _create(path: str, path_type: str) -> bool:
    """Create a missing path; False when it exists (and must then be checked)."""
    if os.path.exists(path):
        return False
    try:
        if path_type == "DirectoryOrCreate":
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:
            os.close(os.open(path, os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o644))
    except OSError as err:
        verb = "mkdir" if path_type == "DirectoryOrCreate" else "open"
        raise VolumeError(FAILED_MOUNT, f"{verb} {path}: {_go_errno(err)}") from None
    return True


def _check_type(path: str, expected: str, description: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise VolumeError(FAILED_MOUNT, f"hostPath {path} doesn't exist") from None
    actual = _file_type(mode)
    if actual is None:
        raise VolumeError(
            FAILED_MOUNT,
            f"hostPath type check failed, {path} is not a {description}, unable to determine "
            "its type: only recognise file, directory, socket, block device and character device",
        )
    if actual != expected:
        message = f"hostPath type check failed: {path} is not a {description}, it's a {actual}"
        raise VolumeError(FAILED_MOUNT, message)


def _file_type(mode: int) -> str | None:
    for test, name in (
        (stat.S_ISDIR, "Directory"),
        (stat.S_ISREG, "File"),
        (stat.S_ISSOCK, "Socket"),
        (stat.S_ISCHR, "CharDevice"),
        (stat.S_ISBLK, "BlockDevice"),
    ):
        if test(mode):
            return name
    return None


def _go_errno(err: OSError) -> str:
    """An errno as Go spells it: ``no such file or directory``."""
    text = err.strerror or str(err)
    return text[:1].lower() + text[1:]

"""volumes.host_path: the hostPath types, their checks, creation and Go's messages."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from trio_kubelet.volumes.errors import VolumeError
from trio_kubelet.volumes.host_path import set_up_host_path


def failure(path: Path | str, path_type: str) -> str:
    with pytest.raises(VolumeError) as caught:
        set_up_host_path({"path": str(path), "type": path_type})
    assert caught.value.reason == "FailedMount"
    return caught.value.message


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "app.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        yield path


def test_unset_type_checks_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    set_up_host_path({"path": str(missing)})
    assert not missing.exists()


def test_directory_or_create_makes_0755_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    old = os.umask(0o022)
    try:
        set_up_host_path({"path": str(path), "type": "DirectoryOrCreate"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    set_up_host_path({"path": str(path), "type": "DirectoryOrCreate"})  # idempotent


def test_file_or_create_needs_the_parent(tmp_path: Path) -> None:
    path = tmp_path / "f"
    set_up_host_path({"path": str(path), "type": "FileOrCreate"})
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) & 0o777 <= 0o644
    missing_parent = tmp_path / "nope" / "f"
    assert failure(missing_parent, "FileOrCreate") == (
        f"open {missing_parent}: no such file or directory"
    )


def test_existing_paths_must_have_the_named_type(tmp_path: Path, sock: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    set_up_host_path({"path": str(tmp_path), "type": "Directory"})
    set_up_host_path({"path": str(file), "type": "File"})
    set_up_host_path({"path": str(sock), "type": "Socket"})
    set_up_host_path({"path": "/dev/null", "type": "CharDevice"})
    assert failure(file, "Directory") == (
        f"hostPath type check failed: {file} is not a directory, it's a File"
    )
    assert failure(file, "DirectoryOrCreate") == (
        f"hostPath type check failed: {file} is not a directory, it's a File"
    )
    assert failure(tmp_path, "FileOrCreate") == (
        f"hostPath type check failed: {tmp_path} is not a file, it's a Directory"
    )
    assert failure(sock, "File") == (
        f"hostPath type check failed: {sock} is not a file, it's a Socket"
    )
    assert failure("/dev/null", "BlockDevice") == (
        "hostPath type check failed: /dev/null is not a block device, it's a CharDevice"
    )


def test_symlinks_are_followed(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    set_up_host_path({"path": str(link), "type": "Directory"})


def test_missing_and_unknown(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert failure(missing, "File") == f"hostPath {missing} doesn't exist"
    assert failure(tmp_path, "Fifo") == "Fifo is an invalid volume type"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert failure(fifo, "File").startswith(
        f"hostPath type check failed, {fifo} is not a file, unable to determine its type"
    )


def test_backsteps_are_rejected() -> None:
    assert failure("/var/../etc", "") == "invalid HostPath `/var/../etc`: must not contain '..'"

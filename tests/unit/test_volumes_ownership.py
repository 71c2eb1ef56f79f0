"""volumes.ownership: fsGroup's group, group bits and setgid directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trio_kubelet.volumes.ownership import set_volume_ownership

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another group needs root")


def mode_and_group(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return stat.S_IMODE(info.st_mode), info.st_gid


@pytest.mark.parametrize(("read_only", "file_mode"), [(False, 0o660), (True, 0o640)])
def test_group_bits_and_setgid(tmp_path: Path, read_only: bool, file_mode: int) -> None:
    (tmp_path / "dir").mkdir(mode=0o700)
    (tmp_path / "dir" / "file").write_text("x")
    (tmp_path / "dir" / "file").chmod(0o600)
    set_volume_ownership(tmp_path / "dir", 1234, read_only=read_only)
    assert mode_and_group(tmp_path / "dir") == (0o2750 if read_only else 0o2770, 1234)
    assert mode_and_group(tmp_path / "dir" / "file") == (file_mode, 1234)


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("x")
    outside.chmod(0o600)
    (tmp_path / "vol").mkdir()
    (tmp_path / "vol" / "link").symlink_to(outside)
    set_volume_ownership(tmp_path / "vol", 1234, read_only=False)
    assert mode_and_group(outside) == (0o600, 0)
    assert os.lstat(tmp_path / "vol" / "link").st_gid == 1234

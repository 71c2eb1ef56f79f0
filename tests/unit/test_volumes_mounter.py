"""volumes.mounter: tmpfs and bind mounts, and reading them back from mountinfo."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trio_kubelet.volumes import mounter

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for point in mounter.mount_points_under(tmp_path):
        mounter.unmount(point)


def test_mount_points_under_are_deepest_and_newest_first(root: Path) -> None:
    outer = root / "with space"
    outer.mkdir()
    mounter.mount_tmpfs(outer, 2**20)
    inner = outer / "inner"
    inner.mkdir()
    mounter.mount_tmpfs(inner, None)
    mounter.bind_mount(str(inner), inner)  # the same path mounted twice
    assert mounter.mount_points_under(root) == [inner, inner, outer]
    assert mounter.fs_type(outer) == "tmpfs"
    assert mounter.fs_type(root) is None
    for point in mounter.mount_points_under(root):
        mounter.unmount(point)
    assert mounter.mount_points_under(root) == []


def test_a_sibling_with_a_common_prefix_is_not_under(root: Path) -> None:
    (root / "pod").mkdir()
    (root / "pod-2").mkdir()
    mounter.mount_tmpfs(root / "pod-2", None)
    assert mounter.mount_points_under(root / "pod") == []


def test_errors_name_the_path(root: Path) -> None:
    with pytest.raises(OSError) as caught:
        mounter.unmount(root)
    assert caught.value.filename == str(root)

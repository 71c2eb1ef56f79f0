"""Fake cgroup filesystems in a temporary directory, for unit tests: cgroupfs's rmdir, and a
cgroup v2 (unified) hierarchy.

Like the kernel's, its ``mkdir`` gives a new cgroup the core interface files plus
those of each controller its parent enables (``cgroup.subtree_control``: the
"+name" tokens last written there, or the kernel's plain listing), and nothing
else; so a writer that forgot to enable a controller finds no file to write. Its
``rmdir`` takes a cgroup's files with it and refuses while ``cgroup.procs`` lists a
task. File contents are those of Linux 6.1 with nothing charged yet.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CONTROLLERS = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc")
CORE_FILES = {
    "cgroup.procs": "",
    "cgroup.subtree_control": "",
    "cgroup.events": "populated 0\nfrozen 0\n",
    "cgroup.type": "domain\n",
    "cpu.stat": "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
}
CONTROLLER_FILES = {
    "cpuset": {"cpuset.cpus": "\n", "cpuset.mems": "\n", "cpuset.cpus.effective": "0-3\n"},
    "cpu": {"cpu.weight": "100\n", "cpu.weight.nice": "0\n", "cpu.max": "max 100000\n",
            "cpu.max.burst": "0\n"},
    "io": {"io.stat": "", "io.max": ""},
    "memory": {"memory.current": "0\n", "memory.min": "0\n", "memory.low": "0\n",
               "memory.high": "max\n", "memory.max": "max\n", "memory.stat": "anon 0\nfile 0\n",
               "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"},
    "hugetlb": {f"hugetlb.{size}.{name}": value for size in ("2MB", "1GB")
                for name, value in (("max", "max\n"), ("rsvd.max", "max\n"),
                                    ("current", "0\n"), ("events", "max 0\n"))},
    "pids": {"pids.max": "max\n", "pids.current": "0\n"},
    "rdma": {"rdma.max": ""},
    "misc": {"misc.max": ""},
}


def cgroupfs_rmdir(real_rmdir: Callable[..., None], path: Any, **kwargs: Any) -> None:
    """rmdir as on cgroupfs: it takes the control files with it, and refuses while tasks
    remain (``cgroup.procs`` not empty)."""
    procs = Path(path, "cgroup.procs")
    if procs.exists() and procs.read_text().strip():
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))
    for entry in os.scandir(path):
        if entry.is_file():
            os.unlink(entry.path)
    real_rmdir(path, **kwargs)


class FakeCgroup2fs:
    """The root of a unified hierarchy; `install` makes mkdir/rmdir below it behave."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "cgroup.controllers").write_text(" ".join(CONTROLLERS) + "\n")
        (root / "cgroup.subtree_control").write_text("")
        (root / "cgroup.procs").write_text("1\n")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_mkdir, real_rmdir = os.mkdir, os.rmdir

        def mkdir(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
            real_mkdir(path, mode, **kwargs)
            if self._inside(path):
                self._populate(Path(path))

        def rmdir(path: Any, **kwargs: Any) -> None:
            if self._inside(path):
                cgroupfs_rmdir(real_rmdir, path, **kwargs)
            else:
                real_rmdir(path, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "rmdir", rmdir)

    def enabled(self, cgroup: str) -> set[str]:
        """The controllers a cgroup enables for its children."""
        text = (self.root / cgroup.strip("/") / "cgroup.subtree_control").read_text()
        return {token.lstrip("+") for token in text.split()}

    def read(self, cgroup: str, name: str) -> str:
        return (self.root / cgroup.strip("/") / name).read_text().strip()

    def _inside(self, path: Any) -> bool:
        return Path(os.fsdecode(path)).is_relative_to(self.root)

    def _populate(self, cgroup: Path) -> None:
        enabled = self.enabled(str(cgroup.parent.relative_to(self.root)))
        files = {**CORE_FILES, "cgroup.controllers": " ".join(sorted(enabled)) + "\n"}
        for controller in enabled:
            files.update(CONTROLLER_FILES[controller])
        for name, text in files.items():
            (cgroup / name).write_text(text)

"""protectKernelDefaults: the kernel settings checked at start, the agent refusing to run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trio_kubelet.node.kernel_tunables import EXPECTED, kernel_default_errors, read_proc_sys


def test_every_setting_as_expected_is_no_error() -> None:
    assert kernel_default_errors(EXPECTED.get) == []


def test_each_difference_is_named_as_go_names_it(tmp_path: Path) -> None:
    for name, value in {**EXPECTED, "vm/overcommit_memory": 0}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"{value}\n")
    (tmp_path / "kernel/panic").unlink()
    errors = kernel_default_errors(lambda name: read_proc_sys(name, tmp_path))
    assert errors == [
        "invalid kernel flag: vm/overcommit_memory, expected value: 1, actual value: 0",
        "invalid kernel flag: kernel/panic, expected value: 10, actual value: unreadable",
    ]


def test_the_agent_refuses_to_start_on_this_host_when_asked_to_protect(tmp_path: Path) -> None:
    """On this machine's real /proc/sys: a start with --protect-kernel-defaults fails at once
    with status 2 and names every differing setting."""
    differing = kernel_default_errors(read_proc_sys)
    if not differing:
        pytest.skip("this host has every expected setting: nothing to refuse")
    run = subprocess.run(
        [sys.executable, "-m", "trio_kubelet", "--protect-kernel-defaults",
         "--hostname-override=n", f"--root-dir={tmp_path}",
         "--container-runtime-endpoint=unix:///nonexistent.sock",
         "--runtime-request-timeout=1s"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert f"protectKernelDefaults: {'; '.join(differing)}" in run.stderr

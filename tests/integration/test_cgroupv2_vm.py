"""The cgroup v2 test VM (scripts/cgroupv2-vm) itself: one real boot, what the guest sees.

`nox -s cgroupv2` trusts this harness to run the cgroup tests on a unified hierarchy; these tests
check that promise on a real QEMU guest instead of assuming it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cgroupv2-vm"
BOOT_TIMEOUT = 600  # seconds; a boot takes ~15 s on an idle machine, TCG on a busy one far more

# Runs in the guest. Every fact goes to OUT/facts; the odd argument checks the quoting.
PROBE = """\
out=$1 probe=$2
{
  echo "arg=$3"
  echo "controllers=$(cat /sys/fs/cgroup/cgroup.controllers)"
  echo "self=$(cat /proc/self/cgroup)"
  awk '$3 == "cgroup" || $3 == "cgroup2" { print "mount=" $2 " " $3 }' /proc/mounts
  echo "cwd=$(pwd)"
  touch "$probe" && echo "probe-written=yes"
} >"$out/facts" 2>&1
exit 7
"""


@pytest.fixture(autouse=True)
def clean_runtime() -> None:
    """No containerd here: this module boots a VM (overrides the conftest's reset)."""


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the cgroup v2 VM needs root (apt-get, QEMU's 9p export of /)"
    if shutil.which("apt-get") is None:
        return "the cgroup v2 VM installs its kernel and QEMU from Debian's packages"
    return None


@dataclass
class Boot:
    status: int
    out: Path
    facts: dict[str, list[str]]
    probe: Path


def vm(*args: str, timeout: float = BOOT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout + 120,  # the first run also fetches the kernel
    )


@pytest.fixture(scope="module")
def boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boot]:
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the cgroup v2 VM cannot run in CI: {reason}")
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("vm-out")
    # In the repository, which the guest sees through its read-only share plus a tmpfs overlay.
    probe = ROOT / f".cgroupv2-vm-probe-{uuid.uuid4().hex}"
    command = ["sh", "-c", PROBE, "probe", str(out), str(probe), "two words 'and' $quotes"]
    done = vm("--out", str(out), "--timeout", str(BOOT_TIMEOUT), "--", *command)
    facts: dict[str, list[str]] = {}
    facts_file = out / "facts"
    text = facts_file.read_text() if facts_file.exists() else ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        facts.setdefault(key, []).append(value)
    assert facts, f"no facts from the guest:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    try:
        yield Boot(done.returncode, out, facts, probe)
    finally:
        probe.unlink(missing_ok=True)


def test_the_commands_exit_status_comes_back(boot: Boot) -> None:
    assert boot.status == 7
    assert (boot.out / "exit-status").read_text().strip() == "7"
    assert "cgroupv2-vm: exit status 7" in (boot.out / "console.log").read_text()


def test_the_guest_has_only_the_unified_hierarchy(boot: Boot) -> None:
    assert boot.facts["mount"] == ["/sys/fs/cgroup cgroup2"]
    assert {"cpu", "io", "memory", "pids"} <= set(boot.facts["controllers"][0].split())
    assert boot.facts["self"] == ["0::/"]


def test_the_command_runs_where_it_was_started_with_its_arguments(boot: Boot) -> None:
    assert boot.facts["cwd"] == [str(ROOT)]
    assert boot.facts["arg"] == ["two words 'and' $quotes"]


def test_guest_writes_to_the_root_stay_in_the_guest(boot: Boot) -> None:
    assert boot.facts["probe-written"] == ["yes"]
    assert not boot.probe.exists()


def test_a_guest_that_outlives_the_timeout_is_killed(tmp_path: Path) -> None:
    if unavailable() is not None:
        pytest.skip(unavailable())
    done = vm("--out", str(tmp_path), "--timeout", "2", "--", "sleep", "600", timeout=2)
    assert done.returncode == 124, done.stderr
    assert "timed out after 2 s" in done.stderr
    assert not (tmp_path / "exit-status").exists()

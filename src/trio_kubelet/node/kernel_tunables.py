"""protectKernelDefaults: the kernel settings the Go kubelet expects a node to have.

With protectKernelDefaults the Go kubelet refuses to start while one differs; without it, Go
writes them. trio-kubelet does the first and never the second: a setting such as
``kernel.panic_on_oops`` reboots the machine on the next oops, a change an operator makes on
purpose (a sysctl.d file), not one an agent should make behind their back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["EXPECTED", "kernel_default_errors", "read_proc_sys"]

# Under /proc/sys, and the value Go's container manager expects of each.
EXPECTED: Mapping[str, int] = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}


def kernel_default_errors(read: Callable[[str], int | None]) -> list[str]:
    """One sentence per setting that differs from ``EXPECTED`` (``read`` gives a setting's
    value, None if it cannot be read), worded as Go's."""
    errors = []
    for name, expected in EXPECTED.items():
        actual = read(name)
        if actual != expected:
            shown = "unreadable" if actual is None else actual
            errors.append(
                f"invalid kernel flag: {name}, expected value: {expected}, actual value: {shown}"
            )
    return errors


def read_proc_sys(name: str, root: Path = Path("/proc/sys")) -> int | None:
    try:
        return int((root / name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None

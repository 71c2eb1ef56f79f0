"""Container resource requests/limits as the Linux cgroup settings the runtime applies."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trio_kubelet.core.pod_cgroups import CPU_PERIOD_US, MIN_QUOTA_US, MIN_SHARES, SHARES_PER_CPU
from trio_kubelet.model.pod import Container
from trio_kubelet.model.quantity import parse_quantity


@dataclass(frozen=True, slots=True)
class LinuxResources:
    cpu_shares: int
    cpu_quota: int  # 0 = no limit
    cpu_period: int
    memory_limit_bytes: int  # 0 = no limit


def linux_resources(container: Container) -> LinuxResources:
    """cpu shares from the request, CFS quota from the limit, memory limit in bytes.

    As the Go kubelet: a missing cpu request falls back to the limit (API defaulting),
    shares are at least 2, and a quota is at least 1 ms per 100 ms period.
    """
    requests, limits = container.resources.requests, container.resources.limits
    cpu_request = requests.get("cpu", limits.get("cpu"))
    shares = MIN_SHARES
    if cpu_request is not None:
        shares = max(MIN_SHARES, math.floor(parse_quantity(cpu_request) * SHARES_PER_CPU))
    quota = 0
    if "cpu" in limits:
        quota = max(MIN_QUOTA_US, math.floor(parse_quantity(limits["cpu"]) * CPU_PERIOD_US))
    memory = math.floor(parse_quantity(limits["memory"])) if "memory" in limits else 0
    return LinuxResources(shares, quota, CPU_PERIOD_US if quota else 0, memory)

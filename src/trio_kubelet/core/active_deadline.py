"""How long a pod may still run under ``spec.activeDeadlineSeconds`` (Go's activeDeadlineHandler).

The deadline counts from the pod's ``status.startTime`` (when the kubelet first took it); a pod
past it is killed and ends Failed with reason ``DeadlineExceeded``, like an eviction but without
a DisruptionTarget condition. The field may be set or lowered on a running pod.
"""

from __future__ import annotations

from trio_kubelet.core.timestamps import parse_time
from trio_kubelet.model.pod import Pod

REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
DEADLINE_EXCEEDED_MESSAGE = "Pod was active on the node longer than the specified deadline"


def seconds_to_deadline(pod: Pod, start_time: str | None, now: float) -> float | None:
    """Seconds before ``pod`` passes its active deadline (0 or less: it has); None when it has
    no deadline, or has not started (no ``start_time``)."""
    deadline = pod.spec.active_deadline_seconds
    started = parse_time(start_time)
    if deadline is None or not started:
        return None
    return started + deadline - now

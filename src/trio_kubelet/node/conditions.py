"""The Node's conditions, as the Go kubelet's node status setters compute them. Pure: no I/O.

Ready says whether the kubelet can run pods (and why not); MemoryPressure, DiskPressure
and PIDPressure come from the eviction manager. Every condition gets a fresh
``lastHeartbeatTime`` each time the status is computed; ``lastTransitionTime`` moves only
when the condition's status changes, so it tells how long the node has been in its state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trio_kubelet.core.timestamps import format_time

READY = "Ready"
MEMORY_PRESSURE = "MemoryPressure"
DISK_PRESSURE = "DiskPressure"
PID_PRESSURE = "PIDPressure"

# (status, reason, message) of each pressure condition, under pressure and not.
_PRESSURE: dict[str, dict[bool, tuple[str, str, str]]] = {
    MEMORY_PRESSURE: {
        True: ("True", "KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
        False: ("False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    },
    DISK_PRESSURE: {
        True: ("True", "KubeletHasDiskPressure", "kubelet has disk pressure"),
        False: ("False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    },
    PID_PRESSURE: {
        True: ("True", "KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
        False: ("False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    },
}
# The order the Go kubelet appends missing conditions in (Ready last: skewed controllers once
# read only the last condition).
CONDITION_ORDER = (MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE, READY)

# Go's runtimeState: no successful runtime status for this long means "container runtime is down".
RUNTIME_DOWN_AFTER = 30.0


def aggregate_message(errors: Sequence[str]) -> str:
    """Messages joined as Go's errors.NewAggregate prints them: unique, ``[a, b]`` when several."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


def runtime_condition_error(what: str, condition: tuple[str, bool, str, str] | None) -> str | None:
    """Why the CRI says ``what`` is not ready, worded as the Go kubelet does; None when ready.

    ``condition`` is the (type, status, reason, message) of a CRI RuntimeCondition
    (RuntimeReady or NetworkReady), None when the runtime did not report it.
    """
    if condition is None:
        return f"{what} not ready: <nil>"
    kind, status, reason, message = condition
    if status:
        return None
    return f"{what} not ready: {kind}=false reason:{reason} message:{message}"


def runtime_errors(
    *, now: float, last_runtime_ok: float | None, runtime_error: str | None
) -> list[str]:
    """Go's runtimeState.runtimeErrors, minus the health checks: has the runtime answered lately?

    ``last_runtime_ok`` is when the runtime last said RuntimeReady (None: not yet);
    ``runtime_error`` is what its last status answer said was wrong.
    """
    errors = []
    if last_runtime_ok is None:
        errors.append("container runtime status check may not have completed yet")
    elif now - last_runtime_ok > RUNTIME_DOWN_AFTER:
        errors.append("container runtime is down")
    if runtime_error:
        errors.append(runtime_error)
    return errors


def _condition(
    kind: str, status: str, reason: str, message: str, heartbeat: str, transition: str
) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": transition,
        "reason": reason,
        "message": message,
    }


def node_conditions(
    previous: Sequence[Mapping[str, Any]],
    *,
    now: float,
    not_ready: Sequence[str],
    memory_pressure: bool = False,
    disk_pressure: bool = False,
    pid_pressure: bool = False,
) -> list[dict[str, Any]]:
    """The node's conditions after this status computation.

    ``previous`` is what the API server holds (conditions the kubelet does not own, such as
    NetworkUnavailable, are kept as they are); ``not_ready`` lists why the node cannot run
    pods, empty when it can.
    """
    stamp = format_time(now)
    pressure = {
        MEMORY_PRESSURE: memory_pressure,
        DISK_PRESSURE: disk_pressure,
        PID_PRESSURE: pid_pressure,
    }
    if not_ready:
        ready = ("False", "KubeletNotReady", aggregate_message(not_ready))
    else:
        ready = ("True", "KubeletReady", "kubelet is posting ready status")

    def updated(old: Mapping[str, Any] | None, kind: str) -> dict[str, Any]:
        status, reason, message = ready if kind == READY else _PRESSURE[kind][pressure[kind]]
        if old is None or old.get("status") != status:
            return _condition(kind, status, reason, message, stamp, stamp)
        if kind != READY:
            # Go rewrites a pressure condition's wording only on a transition.
            reason, message = old.get("reason", reason), old.get("message", message)
        transition = str(old.get("lastTransitionTime") or stamp)
        return _condition(kind, status, reason, message, stamp, transition)

    result: list[dict[str, Any]] = []
    seen: set[str] = set()
    for old in previous:
        kind = str(old.get("type", ""))
        if kind in CONDITION_ORDER and kind not in seen:
            result.append(updated(old, kind))
            seen.add(kind)
        elif kind not in CONDITION_ORDER:
            result.append(dict(old))
    result.extend(updated(None, kind) for kind in CONDITION_ORDER if kind not in seen)
    return result


def conditions_changed(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> bool:
    """Whether two condition lists differ in anything but their heartbeat times."""

    def comparable(conditions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        stripped = [{k: v for k, v in c.items() if k != "lastHeartbeatTime"} for c in conditions]
        return sorted(stripped, key=lambda c: str(c.get("type", "")))

    return comparable(old) != comparable(new)

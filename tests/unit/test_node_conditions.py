"""node/conditions.py: Ready and the pressure conditions, their times and Go's messages."""

from __future__ import annotations

from trio_kubelet.core.timestamps import format_time
from trio_kubelet.node.conditions import (
    aggregate_message,
    conditions_changed,
    node_conditions,
    runtime_condition_error,
    runtime_errors,
)

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
T0_TEXT = "2023-11-14T22:13:20Z"
LATER = T0 + 60
LATER_TEXT = "2023-11-14T22:14:20Z"


def by_type(conditions: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in conditions}


def test_a_new_node_gets_all_four_conditions_in_go_order() -> None:
    conditions = node_conditions([], now=T0 + 0.9, not_ready=[])
    assert conditions == [
        {
            "type": "MemoryPressure",
            "status": "False",
            "lastHeartbeatTime": T0_TEXT,
            "lastTransitionTime": T0_TEXT,
            "reason": "KubeletHasSufficientMemory",
            "message": "kubelet has sufficient memory available",
        },
        {
            "type": "DiskPressure",
            "status": "False",
            "lastHeartbeatTime": T0_TEXT,
            "lastTransitionTime": T0_TEXT,
            "reason": "KubeletHasNoDiskPressure",
            "message": "kubelet has no disk pressure",
        },
        {
            "type": "PIDPressure",
            "status": "False",
            "lastHeartbeatTime": T0_TEXT,
            "lastTransitionTime": T0_TEXT,
            "reason": "KubeletHasSufficientPID",
            "message": "kubelet has sufficient PID available",
        },
        {
            "type": "Ready",
            "status": "True",
            "lastHeartbeatTime": T0_TEXT,
            "lastTransitionTime": T0_TEXT,
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
        },
    ]


def test_transition_time_moves_only_when_the_status_changes() -> None:
    first = node_conditions([], now=T0, not_ready=[])
    same = by_type(node_conditions(first, now=LATER, not_ready=[]))
    assert same["Ready"]["lastTransitionTime"] == T0_TEXT
    assert same["Ready"]["lastHeartbeatTime"] == LATER_TEXT

    down = node_conditions(first, now=LATER, not_ready=["container runtime is down"])
    ready = by_type(down)["Ready"]
    assert ready["status"] == "False"
    assert ready["reason"] == "KubeletNotReady"
    assert ready["message"] == "container runtime is down"
    assert ready["lastTransitionTime"] == LATER_TEXT

    # Still not ready for another reason: the message follows, the transition time stays.
    worse = by_type(node_conditions(down, now=LATER + 60, not_ready=["a", "b"]))["Ready"]
    assert worse["message"] == "[a, b]"
    assert worse["lastTransitionTime"] == LATER_TEXT


def test_pressure_conditions_follow_their_flags() -> None:
    first = node_conditions([], now=T0, not_ready=[])
    pressed = by_type(
        node_conditions(
            first,
            now=LATER,
            not_ready=[],
            memory_pressure=True,
            disk_pressure=True,
            pid_pressure=True,
        )
    )
    assert pressed["MemoryPressure"] == {
        "type": "MemoryPressure",
        "status": "True",
        "lastHeartbeatTime": LATER_TEXT,
        "lastTransitionTime": LATER_TEXT,
        "reason": "KubeletHasInsufficientMemory",
        "message": "kubelet has insufficient memory available",
    }
    assert pressed["DiskPressure"]["reason"] == "KubeletHasDiskPressure"
    assert pressed["PIDPressure"]["message"] == "kubelet has insufficient PID available"
    assert pressed["Ready"]["status"] == "True"  # pressure alone does not make a node NotReady


def test_conditions_of_others_are_kept_in_place() -> None:
    network = {
        "type": "NetworkUnavailable",
        "status": "False",
        "reason": "RouteCreated",
        "message": "route created",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
        "lastHeartbeatTime": "2020-01-01T00:00:00Z",
    }
    old_ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
    }
    conditions = node_conditions([network, old_ready], now=T0, not_ready=[])
    assert [c["type"] for c in conditions] == [
        "NetworkUnavailable",
        "Ready",
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
    ]
    assert conditions[0] == network
    assert conditions[1]["lastTransitionTime"] == "2020-01-01T00:00:00Z"


def test_messages_aggregate_like_go() -> None:
    assert aggregate_message(["one"]) == "one"
    assert aggregate_message(["one", "two", "one"]) == "[one, two]"
    assert aggregate_message(["same", "same"]) == "same"


def test_runtime_errors_from_the_last_runtime_status() -> None:
    never = runtime_errors(now=100.0, last_runtime_ok=None, runtime_error=None)
    assert never == ["container runtime status check may not have completed yet"]
    assert runtime_errors(now=100.0, last_runtime_ok=95.0, runtime_error=None) == []
    assert runtime_errors(now=100.0, last_runtime_ok=60.0, runtime_error="x") == [
        "container runtime is down",
        "x",
    ]


def test_cri_conditions_are_worded_as_go_prints_them() -> None:
    network = (
        "NetworkReady",
        False,
        "NetworkPluginNotReady",
        "Network plugin returns error: cni plugin not initialized",
    )
    assert runtime_condition_error("container runtime network", network) == (
        "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
        "message:Network plugin returns error: cni plugin not initialized"
    )
    assert runtime_condition_error("container runtime", ("RuntimeReady", True, "", "")) is None
    assert runtime_condition_error("container runtime", None) == (
        "container runtime not ready: <nil>"
    )


def test_heartbeats_alone_are_no_change() -> None:
    first = node_conditions([], now=T0, not_ready=[])
    later = node_conditions(first, now=LATER, not_ready=[])
    assert not conditions_changed(first, list(reversed(later)))
    assert conditions_changed(first, node_conditions(first, now=LATER, not_ready=["x"]))
    assert conditions_changed(first, later[:3])


def test_times_are_whole_seconds_utc() -> None:
    assert format_time(T0 + 0.999) == T0_TEXT

"""watch: kubectl's STATUS/READY columns for a pod, ages, and the live table printer."""

from __future__ import annotations

import io
from typing import Any

import pytest
import trio
import trio.testing

from trio_kubelet.clock import TrioWallClock
from trio_kubelet.model.pod import Pod
from trio_kubelet.status.store import PodStatusStore
from trio_kubelet.watch import (
    WIDTHS,
    header,
    human_age,
    pod_row,
    pod_status_text,
    print_pod_changes,
)

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
T0_TEXT = "2023-11-14T22:13:20Z"

RUNNING_READY = {"state": {"running": {"startedAt": T0_TEXT}}, "ready": True}
WAITING_INIT = {"state": {"waiting": {"reason": "PodInitializing"}}}


def status_of(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox:1.36", **fields}


def terminated(exit_code: int, reason: str | None = None, signal: int | None = None
               ) -> dict[str, Any]:
    state: dict[str, Any] = {"exitCode": exit_code}
    if reason:
        state["reason"] = reason
    if signal:
        state["signal"] = signal
    return {"state": {"terminated": state}}


def waiting(reason: str) -> dict[str, Any]:
    return {"state": {"waiting": {"reason": reason}}}


def make_pod(
    *,
    containers: tuple[str, ...] = ("main",),
    init: tuple[str, ...] = (),
    sidecars: tuple[str, ...] = (),
    phase: str = "Running",
    statuses: dict[str, dict[str, Any]] | None = None,
    init_statuses: dict[str, dict[str, Any]] | None = None,
    conditions: dict[str, str] | None = None,
    deleting: bool = False,
    name: str = "web",
    uid: str = "uid-web",
) -> Pod:
    """Sidecars are declared before the regular init containers, as is usual."""
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid}
    if deleting:
        metadata["deletionTimestamp"] = T0_TEXT
    init_specs = [{"name": n, "image": "busybox:1.36", "restartPolicy": "Always"}
                  for n in sidecars] + [{"name": n, "image": "busybox:1.36"} for n in init]
    return Pod.model_validate({
        "metadata": metadata,
        "spec": {
            "initContainers": init_specs,
            "containers": [{"name": n, "image": "busybox:1.36"} for n in containers],
        },
        "status": {
            "phase": phase,
            "startTime": T0_TEXT,
            "conditions": [{"type": t, "status": v} for t, v in (conditions or {}).items()],
            "initContainerStatuses": [
                status_of(n, **fields) for n, fields in (init_statuses or {}).items()
            ],
            "containerStatuses": [
                status_of(n, **fields) for n, fields in (statuses or {}).items()
            ],
        },
    })


# -- STATUS column -----------------------------------------------------------------------------


def test_init_containers_not_started_show_their_progress() -> None:
    pod = make_pod(init=("setup", "migrate"), phase="Pending",
                   init_statuses={"setup": waiting("PodInitializing"),
                                  "migrate": waiting("PodInitializing")},
                   statuses={"main": WAITING_INIT})
    assert pod_status_text(pod) == "Init:0/2"


def test_second_init_container_running_shows_one_of_two() -> None:
    pod = make_pod(init=("setup", "migrate"), phase="Pending",
                   init_statuses={"setup": terminated(0, "Completed"),
                                  "migrate": {"state": {"running": {}}}},
                   statuses={"main": WAITING_INIT})
    assert pod_status_text(pod) == "Init:1/2"


@pytest.mark.parametrize(
    ("init_state", "expected"),
    [
        (terminated(1, "Error"), "Init:Error"),
        (terminated(3), "Init:ExitCode:3"),
        (terminated(137, signal=9), "Init:Signal:9"),
        (terminated(137, "OOMKilled"), "Init:OOMKilled"),
        (waiting("CrashLoopBackOff"), "Init:CrashLoopBackOff"),
        (waiting("ErrImagePull"), "Init:ErrImagePull"),
    ],
)
def test_a_failing_init_container_shows_its_reason(init_state: dict[str, Any],
                                                   expected: str) -> None:
    pod = make_pod(init=("setup", "migrate"), phase="Pending",
                   init_statuses={"setup": init_state, "migrate": waiting("PodInitializing")},
                   statuses={"main": WAITING_INIT})
    assert pod_status_text(pod) == expected


def test_init_done_and_containers_waiting_shows_pod_initializing() -> None:
    pod = make_pod(init=("setup",), phase="Pending",
                   init_statuses={"setup": terminated(0, "Completed")},
                   statuses={"main": WAITING_INIT})
    assert pod_status_text(pod) == "PodInitializing"


def test_container_creating_shows_its_reason() -> None:
    pod = make_pod(phase="Pending", statuses={"main": waiting("ContainerCreating")})
    assert pod_status_text(pod) == "ContainerCreating"


def test_crash_looping_container_shows_crash_loop_back_off() -> None:
    pod = make_pod(containers=("main", "helper"),
                   statuses={"main": waiting("CrashLoopBackOff"), "helper": RUNNING_READY})
    assert pod_status_text(pod) == "CrashLoopBackOff"


def test_first_container_wins_like_kubectl() -> None:
    # kubectl walks the statuses from last to first, so the first container's reason is shown.
    pod = make_pod(containers=("a", "b"),
                   statuses={"a": waiting("ImagePullBackOff"), "b": waiting("CrashLoopBackOff")})
    assert pod_status_text(pod) == "ImagePullBackOff"


def test_succeeded_pod_shows_completed() -> None:
    pod = make_pod(phase="Succeeded", statuses={"main": terminated(0, "Completed")})
    assert pod_status_text(pod) == "Completed"


def test_failed_pod_shows_error_or_exit_code() -> None:
    assert pod_status_text(make_pod(phase="Failed",
                                    statuses={"main": terminated(1, "Error")})) == "Error"
    assert pod_status_text(make_pod(phase="Failed",
                                    statuses={"main": terminated(2)})) == "ExitCode:2"
    assert pod_status_text(make_pod(phase="Failed",
                                    statuses={"main": terminated(143, signal=15)})) == "Signal:15"


def test_running_ready_pod_shows_running() -> None:
    assert pod_status_text(make_pod(statuses={"main": RUNNING_READY})) == "Running"


def test_pod_reason_is_shown_over_the_phase() -> None:
    pod = make_pod(statuses={"main": {"state": {"running": {}}}})
    pod.status.reason = "Evicted"
    assert pod_status_text(pod) == "Evicted"


def test_completed_beside_a_running_container_shows_running() -> None:
    pod = make_pod(containers=("job", "server"), conditions={"Ready": "True"},
                   statuses={"job": terminated(0, "Completed"), "server": RUNNING_READY})
    assert pod_status_text(pod) == "Running"


def test_deleted_pod_shows_terminating() -> None:
    pod = make_pod(deleting=True, statuses={"main": RUNNING_READY})
    assert pod_status_text(pod) == "Terminating"


def test_regular_init_done_and_sidecar_started_are_not_init_progress() -> None:
    pod = make_pod(sidecars=("proxy",), init=("setup",),
                   init_statuses={"proxy": {**RUNNING_READY, "started": True},
                                  "setup": terminated(0, "Completed")},
                   statuses={"main": RUNNING_READY})
    assert pod_status_text(pod) == "Running"


def test_init_progress_counts_sidecars_like_kubectl() -> None:
    pod = make_pod(sidecars=("proxy",), init=("setup",), phase="Pending",
                   init_statuses={"proxy": {**RUNNING_READY, "started": True},
                                  "setup": {"state": {"running": {}}}},
                   statuses={"main": WAITING_INIT})
    assert pod_status_text(pod) == "Init:1/2"


def test_completed_beside_running_without_ready_condition_is_not_ready() -> None:
    pod = make_pod(containers=("job", "server"), conditions={"Ready": "False"},
                   statuses={"job": terminated(0, "Completed"), "server": RUNNING_READY})
    assert pod_status_text(pod) == "NotReady"


# -- READY, RESTARTS and AGE -------------------------------------------------------------------


def test_pod_row_ready_counts_sidecars_but_not_regular_init_containers() -> None:
    pod = make_pod(
        containers=("main", "helper"), sidecars=("proxy",), init=("setup",),
        init_statuses={
            "proxy": {**RUNNING_READY, "started": True, "restartCount": 2},
            "setup": {**terminated(0, "Completed"), "ready": True},
        },
        statuses={"main": {**RUNNING_READY, "restartCount": 1},
                  "helper": {"state": {"running": {}}, "ready": False}},
    )
    row = pod_row(pod, now=T0 + 30)
    assert row.ready == "2/3"
    assert row.restarts == 3
    assert (row.name, row.phase, row.status) == ("web", "Running", "Running")
    assert row.started == T0


def test_pod_row_without_start_time_is_new() -> None:
    pod = make_pod(phase="Pending", statuses={"main": waiting("ContainerCreating")})
    pod.status.start_time = None
    row = pod_row(pod, now=T0 + 5)
    assert row.started == T0 + 5 and row.ready == "0/1"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-3, "0s"), (0, "0s"), (59.9, "59s"), (119, "119s"), (120, "2m"), (7199, "119m"),
     (7200, "2h"), (90000, "25h")],
)
def test_human_age(seconds: float, text: str) -> None:
    assert human_age(seconds) == text


def test_row_renders_in_fixed_columns() -> None:
    row = pod_row(make_pod(statuses={"main": RUNNING_READY}), now=T0 + 150)
    line = row.render(T0 + 150)
    assert len(line) == sum(WIDTHS)
    assert line.split() == ["web", "Running", "1/1", "Running", "0", "2m"]
    assert header().split() == ["NAME", "PHASE", "READY", "STATUS", "RESTARTS", "AGE"]


# -- the live table ----------------------------------------------------------------------------


async def test_print_pod_changes_prints_a_header_then_one_line_per_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = PodStatusStore()
    out = io.StringIO()
    clock = TrioWallClock(epoch=T0 + 10)
    web = make_pod(statuses={"main": RUNNING_READY})
    pending = make_pod(phase="Pending", statuses={"main": waiting("ContainerCreating")})
    store.set(web, pending.status)

    def lines() -> list[list[str]]:
        return [line.split() for line in out.getvalue().splitlines()]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(print_pod_changes, store, out, clock)
        await trio.testing.wait_all_tasks_blocked()
        assert lines() == [
            ["NAME", "PHASE", "READY", "STATUS", "RESTARTS", "AGE"],
            ["web", "Pending", "0/1", "ContainerCreating", "0", "10s"],
        ]

        store.set(web, web.status)
        await trio.testing.wait_all_tasks_blocked()
        assert lines()[2:] == [["web", "Running", "1/1", "Running", "0", "10s"]]

        # A second pod changing prints its line only, not the unchanged one again.
        db = make_pod(name="db", uid="uid-db", statuses={"main": RUNNING_READY})
        store.set(db, db.status)
        await trio.testing.wait_all_tasks_blocked()
        assert lines()[3:] == [["db", "Running", "1/1", "Running", "0", "10s"]]

        store.remove(web.metadata.uid)
        await trio.testing.wait_all_tasks_blocked()
        assert lines()[4:] == [["web", "-", "0/0", "Deleted", "0", "10s"]]
        assert len(lines()) == 5
        nursery.cancel_scope.cancel()


def test_without_container_statuses_the_phase_is_shown() -> None:
    assert pod_status_text(make_pod(phase="Pending")) == "Pending"

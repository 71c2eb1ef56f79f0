"""core.pleg: one relist as a snapshot, and the lifecycle events between two snapshots."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trio_kubelet.core.observed import (
    ContainerState,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.core.pleg import Lifecycle, PlegState, lifecycle_events, snapshot

Snapshot = dict[str, tuple[str, PlegState]]


def pod(uid: str, sandboxes: dict[str, SandboxState], containers: dict[str, ContainerState]
        ) -> RuntimePodStatus:
    return RuntimePodStatus(
        uid=uid,
        sandboxes=tuple(RuntimeSandbox(id=sid, state=state) for sid, state in sandboxes.items()),
        containers=tuple(
            RuntimeContainer(id=cid, name=f"c-{cid}", state=state)
            for cid, state in containers.items()
        ),
    )


# -- snapshot ----------------------------------------------------------------------------------


def test_snapshot_maps_every_sandbox_and_container_to_its_pod_and_pleg_state() -> None:
    web = pod(
        "uid-web",
        {"sb-new": SandboxState.READY, "sb-old": SandboxState.NOTREADY},
        {
            "run": ContainerState.RUNNING,
            "done": ContainerState.EXITED,
            "made": ContainerState.CREATED,
            "lost": ContainerState.UNKNOWN,
        },
    )
    db = pod("uid-db", {"sb-db": SandboxState.READY}, {"main": ContainerState.RUNNING})

    assert snapshot([web, db]) == {
        "sb-new": ("uid-web", "running"),
        "sb-old": ("uid-web", "exited"),
        "run": ("uid-web", "running"),
        "done": ("uid-web", "exited"),
        "made": ("uid-web", "unknown"),
        "lost": ("uid-web", "unknown"),
        "sb-db": ("uid-db", "running"),
        "main": ("uid-db", "running"),
    }


def test_snapshot_of_nothing_is_empty() -> None:
    assert snapshot([]) == {}
    assert snapshot([RuntimePodStatus(uid="empty")]) == {}


# -- lifecycle events --------------------------------------------------------------------------


def test_new_running_container_is_started() -> None:
    assert lifecycle_events({}, {"c1": ("p", "running")}) == [
        Lifecycle("p", "ContainerStarted", "c1")
    ]


def test_running_container_that_exits_died() -> None:
    old: Snapshot = {"c1": ("p", "running")}
    assert lifecycle_events(old, {"c1": ("p", "exited")}) == [
        Lifecycle("p", "ContainerDied", "c1")
    ]


def test_container_first_seen_exited_died() -> None:
    # Created and exited between two relists: the worker must still hear about it.
    assert lifecycle_events({}, {"c1": ("p", "exited")}) == [Lifecycle("p", "ContainerDied", "c1")]


def test_exited_container_that_disappears_is_only_removed() -> None:
    assert lifecycle_events({"c1": ("p", "exited")}, {}) == [
        Lifecycle("p", "ContainerRemoved", "c1")
    ]


def test_running_container_that_disappears_died_then_was_removed() -> None:
    assert lifecycle_events({"c1": ("p", "running")}, {}) == [
        Lifecycle("p", "ContainerDied", "c1"),
        Lifecycle("p", "ContainerRemoved", "c1"),
    ]


def test_unknown_container_that_disappears_died_then_was_removed() -> None:
    assert lifecycle_events({"c1": ("p", "unknown")}, {}) == [
        Lifecycle("p", "ContainerDied", "c1"),
        Lifecycle("p", "ContainerRemoved", "c1"),
    ]


def test_becoming_unknown_or_created_is_not_reported() -> None:
    assert lifecycle_events({"c1": ("p", "running")}, {"c1": ("p", "unknown")}) == []
    assert lifecycle_events({}, {"c2": ("p", "unknown")}) == []
    created = snapshot([pod("p", {}, {"c3": ContainerState.CREATED})])
    assert lifecycle_events({}, created) == []


def test_unknown_container_that_starts_running_is_started() -> None:
    assert lifecycle_events({"c1": ("p", "unknown")}, {"c1": ("p", "running")}) == [
        Lifecycle("p", "ContainerStarted", "c1")
    ]


def test_unchanged_snapshot_has_no_events() -> None:
    same = snapshot([
        pod("p", {"sb": SandboxState.READY},
            {"a": ContainerState.RUNNING, "b": ContainerState.EXITED}),
    ])
    assert lifecycle_events(same, dict(same)) == []


def test_sandboxes_are_treated_as_containers() -> None:
    ready = snapshot([pod("p", {"sb": SandboxState.READY}, {})])
    stopped = snapshot([pod("p", {"sb": SandboxState.NOTREADY}, {})])
    assert lifecycle_events({}, ready) == [Lifecycle("p", "ContainerStarted", "sb")]
    assert lifecycle_events(ready, stopped) == [Lifecycle("p", "ContainerDied", "sb")]
    assert lifecycle_events(stopped, {}) == [Lifecycle("p", "ContainerRemoved", "sb")]
    assert lifecycle_events(ready, {}) == [
        Lifecycle("p", "ContainerDied", "sb"),
        Lifecycle("p", "ContainerRemoved", "sb"),
    ]


def test_events_carry_the_pod_of_each_container() -> None:
    old = snapshot([pod("a", {}, {"a1": ContainerState.RUNNING}),
                    pod("b", {}, {"b1": ContainerState.RUNNING})])
    new = snapshot([pod("a", {}, {"a1": ContainerState.EXITED})])
    assert sorted(lifecycle_events(old, new), key=lambda e: (e.container_id, e.type)) == [
        Lifecycle("a", "ContainerDied", "a1"),
        Lifecycle("b", "ContainerDied", "b1"),
        Lifecycle("b", "ContainerRemoved", "b1"),
    ]


# -- property ----------------------------------------------------------------------------------

STATES: tuple[PlegState, ...] = ("running", "exited", "unknown")
IDS = [f"c{i}" for i in range(12)]


def _uid(cid: str) -> str:
    # An ID belongs to one pod for its whole life, as on a real runtime.
    return f"pod-{int(cid[1:]) % 3}"


snapshots = st.dictionaries(
    st.sampled_from(IDS), st.sampled_from(STATES), max_size=len(IDS)
).map(lambda states: {cid: (_uid(cid), state) for cid, state in states.items()})


def _expected(cid: str, old: Snapshot, new: Snapshot) -> list[str]:
    """The event types for one ID, stated from the PLEG rules independently of the code."""
    before = old[cid][1] if cid in old else None
    after = new[cid][1] if cid in new else None
    if before == after:
        return []
    if after is None:
        return ["ContainerRemoved"] if before == "exited" else ["ContainerDied", "ContainerRemoved"]
    return {"running": ["ContainerStarted"], "exited": ["ContainerDied"], "unknown": []}[after]


@given(old=snapshots, new=snapshots)
def test_every_changed_id_gets_exactly_its_events(old: Snapshot, new: Snapshot) -> None:
    events = lifecycle_events(old, new)
    by_id: dict[str, list[str]] = {}
    for event in events:
        assert event.pod_uid == _uid(event.container_id)
        by_id.setdefault(event.container_id, []).append(event.type)
    for cid in old.keys() | new.keys():
        assert by_id.pop(cid, []) == _expected(cid, old, new), cid
    assert by_id == {}, "events for IDs in neither snapshot"


@given(old=snapshots)
def test_no_change_means_no_events(old: Snapshot) -> None:
    assert lifecycle_events(old, dict(old)) == []

"""core.pleg: one relist as a snapshot, the lifecycle events between two snapshots, and
relists merged with the runtime's events (`PlegRecords`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_kubelet.core.observed import (
    ContainerState,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.core.pleg import (
    REMEMBERED_REMOVALS,
    Lifecycle,
    PlegRecords,
    PlegState,
    RuntimeEvent,
    RuntimeEventType,
    accounted_changes,
    lifecycle_events,
    snapshot,
)

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


# -- merging relists and the runtime's events ---------------------------------------------------


def event(cid: str, type: RuntimeEventType, uid: str = "p") -> RuntimeEvent:
    return RuntimeEvent(container_id=cid, type=type, pod_uid=uid)


def told(records: PlegRecords, *events: RuntimeEvent) -> tuple[PlegRecords, list[Lifecycle]]:
    """Apply events in turn; the records after them and everything they told."""
    changes: list[Lifecycle] = []
    for one in events:
        records, now = records.on_event(one)
        changes += now
    return records, changes


def test_each_event_tells_its_change_once() -> None:
    records, changes = told(PlegRecords(), event("c1", "created"), event("c1", "started"),
                            event("c1", "stopped"), event("c1", "deleted"))
    assert changes == [Lifecycle("p", "ContainerStarted", "c1"),
                       Lifecycle("p", "ContainerDied", "c1"),
                       Lifecycle("p", "ContainerRemoved", "c1")]
    assert records.records == {}


def test_a_relist_after_the_events_tells_nothing_again() -> None:
    records, _ = told(PlegRecords(), event("c1", "started"), event("c2", "started"),
                      event("c2", "stopped"))
    after, changes = records.relisted({"c1": ("p", "running"), "c2": ("p", "exited")})
    assert changes == []
    assert after.records == {"c1": ("p", "running"), "c2": ("p", "exited")}


def test_an_event_the_relist_already_reported_tells_nothing() -> None:
    # The stop happened during the relist: the relist saw it, its event comes after.
    records, changes = PlegRecords().relisted({"c1": ("p", "exited")})
    assert changes == [Lifecycle("p", "ContainerDied", "c1")]
    assert told(records, event("c1", "started"), event("c1", "stopped")) == (records, [])


def test_a_late_event_does_not_bring_back_what_a_relist_saw_deleted() -> None:
    records, _ = PlegRecords().relisted({"c1": ("p", "running")})
    records, changes = records.relisted({})
    assert changes == [Lifecycle("p", "ContainerDied", "c1"),
                       Lifecycle("p", "ContainerRemoved", "c1")]
    assert told(records, event("c1", "stopped"), event("c1", "deleted")) == (records, [])
    # However many relists later, as long as fewer than 1024 other IDs went since.
    for _ in range(5):
        records, _ = records.relisted({})
    assert told(records, event("c1", "stopped"))[1] == []


def test_removed_ids_are_remembered_in_two_generations() -> None:
    many = {f"c{i}": ("p", "exited") for i in range(REMEMBERED_REMOVALS + 1)}
    records, _ = PlegRecords().relisted({"old": ("p", "exited")})
    records, _ = records.relisted(many)
    records, _ = records.relisted({})  # old, then 1025 more: a new generation
    assert "old" in records.gone_before | records.gone
    records, _ = records.relisted({"x": ("p", "exited")})
    records, _ = records.relisted({})  # x does not fit the newest generation: old is out
    assert "old" not in records.gone_before | records.gone
    assert told(records, event("old", "stopped"))[1] == [Lifecycle("p", "ContainerDied", "old")]


def test_a_late_event_does_not_bring_back_what_an_event_deleted() -> None:
    records, _ = told(PlegRecords(), event("c1", "started"), event("c1", "deleted"))
    assert told(records, event("c1", "stopped")) == (records, [])


def test_an_event_without_a_pod_for_an_unknown_id_is_ignored() -> None:
    # Objects without our pod label were not made by a kubelet.
    assert PlegRecords().on_event(event("x", "started", uid="")) == (PlegRecords(), [])
    assert PlegRecords().on_event(event("x", "deleted")) == (PlegRecords(), [])


def test_a_known_id_keeps_its_pod_whatever_the_event_says() -> None:
    records, _ = PlegRecords().relisted({"sb": ("p", "running")})
    records, changes = records.on_event(event("sb", "stopped", uid=""))
    assert changes == [Lifecycle("p", "ContainerDied", "sb")]


def test_created_is_recorded_without_telling() -> None:
    records, changes = PlegRecords().on_event(event("c1", "created"))
    assert (changes, records.records) == ([], {"c1": ("p", "unknown")})
    # Deleted before it ever ran: the same as a relist would tell.
    assert records.on_event(event("c1", "deleted"))[1] == [
        Lifecycle("p", "ContainerDied", "c1"), Lifecycle("p", "ContainerRemoved", "c1")]


def test_a_relist_is_the_truth_even_against_earlier_events() -> None:
    # The runtime lost track of a running container: the relist says unknown, told as
    # nothing (as between two relists), and a later stop is told.
    records, _ = told(PlegRecords(), event("c1", "started"))
    records, changes = records.relisted({"c1": ("p", "unknown")})
    assert changes == []
    assert records.on_event(event("c1", "stopped"))[1] == [Lifecycle("p", "ContainerDied", "c1")]


# A runtime's history, and what PLEG sees of it: each container is created, started (or fails
# to start: no event), stopped and deleted; events reach PLEG in order but late, a broken
# stream loses the ones not yet delivered and those of the time it is down; relists see the
# truth at any moment (never while PLEG applies an event).
_STEPS: dict[str, tuple[str, PlegState | None, RuntimeEventType | None]] = {
    # from state: (to state, its PLEG state (None: gone), the event it sends)
    "new": ("created", "unknown", "created"),
    "created": ("running", "running", "started"),
    "running": ("exited", "exited", "stopped"),
    "exited": ("deleted", None, "deleted"),
}
ORDER = ["ContainerStarted", "ContainerDied", "ContainerRemoved"]
actions = st.lists(st.one_of(
    st.tuples(st.just("advance"), st.sampled_from(IDS[:3]), st.booleans()),
    st.tuples(st.sampled_from(["deliver", "relist", "break", "reopen"]))), max_size=60)


@settings(max_examples=400)
@given(actions)
def test_relists_and_events_in_any_interleaving_tell_each_change_once_in_order(
    steps: list[tuple[object, ...]],
) -> None:
    truth: dict[str, str] = {}
    pending: list[RuntimeEvent] = []
    stream_up = True
    records = PlegRecords()
    changes: list[Lifecycle] = []

    def now() -> dict[str, tuple[str, PlegState]]:
        snap: dict[str, tuple[str, PlegState]] = {}
        for cid, state in truth.items():
            pleg_state = {"created": "unknown", "running": "running", "exited": "exited"}.get(state)
            if pleg_state is not None:
                snap[cid] = (_uid(cid), pleg_state)  # type: ignore[assignment]
        return snap

    for step in [*steps, ("reopen",), *[("deliver",)] * 100, ("relist",)]:
        if step[0] == "advance":
            _, cid, fail_start = step
            assert isinstance(cid, str)
            state = truth.get(cid, "new")
            if state == "deleted":
                continue
            to, _, kind = _STEPS[state]
            if state == "created" and fail_start:
                to, kind = "exited", None  # containerd sends nothing for a failed start
            truth[cid] = to
            if kind is not None and stream_up:
                pending.append(RuntimeEvent(cid, kind, _uid(cid)))
        elif step[0] == "deliver" and pending:
            records, new = records.on_event(pending.pop(0))
            changes += new
        elif step[0] == "relist":
            records, new = records.relisted(now())
            changes += new
        elif step[0] == "break":
            pending.clear()
            stream_up = False
        elif step[0] == "reopen" and not stream_up:
            # The PLEG relists after a stream reopens (what the shell guarantees).
            stream_up = True
            records, new = records.relisted(now())
            changes += new

    assert records.records == now()
    by_id: dict[str, list[str]] = {}
    for change in changes:
        assert change.pod_uid == _uid(change.container_id)
        by_id.setdefault(change.container_id, []).append(change.type)
    for cid, kinds in by_id.items():
        positions = [ORDER.index(kind) for kind in kinds]
        assert positions == sorted(set(positions)), f"{cid}: {kinds} repeats or goes back"
        if truth[cid] == "deleted":
            assert "ContainerRemoved" in kinds, f"{cid} was told of but its deletion was lost"
        if truth[cid] in ("exited", "deleted") and "ContainerStarted" in kinds:
            assert "ContainerDied" in kinds, f"{cid} was told started, its death was lost"


# -- what a sync accounted for -----------------------------------------------------------------


def test_a_look_accounts_for_the_starts_and_exits_it_shows() -> None:
    status = pod("p", {"new": SandboxState.READY, "old": SandboxState.NOTREADY},
                 {"up": ContainerState.RUNNING, "done": ContainerState.EXITED,
                  "made": ContainerState.CREATED, "odd": ContainerState.UNKNOWN})
    assert accounted_changes(status) == {
        ("new", "ContainerStarted"), ("old", "ContainerStarted"), ("old", "ContainerDied"),
        ("up", "ContainerStarted"), ("done", "ContainerStarted"), ("done", "ContainerDied"),
    }, "the exit of a running one, the start of a created one: news"

"""core.container_gc: which dead containers, sandboxes and pod log directories a pass removes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_kubelet.core.container_gc import (
    GCContainer,
    GCPlan,
    GCPolicy,
    GCSandbox,
    log_dir_pod_uid,
    plan_container_gc,
)
from trio_kubelet.core.observed import ContainerState, SandboxState

RUNNING, EXITED = ContainerState.RUNNING, ContainerState.EXITED
CREATED, UNKNOWN = ContainerState.CREATED, ContainerState.UNKNOWN
READY, NOTREADY = SandboxState.READY, SandboxState.NOTREADY
NOW = 1_700_000_000.0
WEB, API, GONE = "uid-web", "uid-api", "uid-gone"
DEFAULT = GCPolicy()


def dead(id: str, uid: str = WEB, name: str = "main", *, age: float = 100.0,
         state: ContainerState = EXITED, sandbox: str = "") -> GCContainer:
    return GCContainer(id=id, pod_uid=uid, name=name, state=state, created_at=NOW - age,
                       sandbox_id=sandbox or f"sb-{uid}")


def sandbox(id: str, uid: str = WEB, *, age: float = 1000.0,
            state: SandboxState = NOTREADY) -> GCSandbox:
    return GCSandbox(id=id, pod_uid=uid, state=state, created_at=NOW - age)


def plan(containers: Iterable[GCContainer] = (), sandboxes: Iterable[GCSandbox] = (), *,
         policy: GCPolicy = DEFAULT, existing: Iterable[str] = (WEB, API),
         ready: bool = True, log_dirs: Iterable[str] = ()) -> GCPlan:
    return plan_container_gc(containers, sandboxes, policy=policy, now=NOW,
                             existing_pods=set(existing), sources_ready=ready,
                             log_dirs=log_dirs)


def ids(plan: GCPlan) -> list[str]:
    return [c.id for c in plan.containers]


# -- per container ---------------------------------------------------------------------------


def test_default_policy_keeps_the_newest_dead_instance_and_the_running_one() -> None:
    containers = [dead("c0", age=40), dead("c1", age=30), dead("c2", age=20),
                  dead("c3", age=10, state=RUNNING)]
    result = plan(containers)
    assert ids(result) == ["c0", "c1"], "oldest first"
    assert result.dead == 3


def test_units_are_per_pod_and_container_name() -> None:
    containers = [dead("w-main-0", age=20), dead("w-main-1", age=10),
                  dead("w-side-0", name="side", age=20),
                  dead("a-main-0", API, age=30), dead("a-main-1", API, age=5)]
    assert ids(plan(containers)) == ["a-main-0", "w-main-0"]


def test_a_dead_container_younger_than_the_ttl_stays() -> None:
    containers = [dead("c0", age=300), dead("c1", age=200), dead("c2", age=50), dead("c3", age=5)]
    # c2 and c3 are too young to count; of the old enough ones the newest (c1) stays.
    assert ids(plan(containers, policy=GCPolicy(min_age=60))) == ["c0"]
    assert ids(plan(containers, policy=GCPolicy(min_age=400))) == []


def test_negative_per_container_limit_keeps_everything() -> None:
    containers = [dead(f"c{i}", age=10 * i + 1) for i in range(5)]
    assert ids(plan(containers, policy=GCPolicy(max_per_pod_container=-1))) == []
    assert ids(plan(containers, policy=GCPolicy(max_per_pod_container=3))) == ["c4", "c3"]


def test_the_newest_dead_instance_of_an_existing_pod_survives_a_zero_limit() -> None:
    # Go would remove it; here it is the only record of the container's exit.
    containers = [dead("c0", age=30), dead("c1", age=20), dead("c2", age=10)]
    assert ids(plan(containers, policy=GCPolicy(max_per_pod_container=0))) == ["c0", "c1"]


def test_a_created_or_unknown_newest_instance_is_protected_too() -> None:
    containers = [dead("e0", age=40), dead("e1", age=30), dead("c1", age=20, state=UNKNOWN),
                  dead("c2", age=10, state=CREATED)]
    # c2 is the newest, e1 the newest exit: both stay.
    assert ids(plan(containers, policy=GCPolicy(max_per_pod_container=0))) == ["e0", "c1"]


def test_a_starting_instance_does_not_push_out_the_exit_before_it() -> None:
    # The worker killed c0 for a changed spec and is starting c1: the runtime lists c1 as
    # created. c0 is the restarted container's lastState; both stay.
    containers = [dead("c0", age=1), dead("c1", age=0.5, state=CREATED)]
    assert ids(plan(containers)) == []
    older = [dead("old", age=60), *containers]
    assert ids(plan(older)) == ["old"]
    assert ids(plan(containers, existing=())) == ["c0", "c1"], "a gone pod keeps nothing"


def test_creation_time_ties_are_broken_by_attempt() -> None:
    old = GCContainer(id="b", pod_uid=WEB, name="main", state=EXITED, created_at=NOW - 5,
                      attempt=1)
    new = GCContainer(id="a", pod_uid=WEB, name="main", state=EXITED, created_at=NOW - 5,
                      attempt=2)
    assert ids(plan([new, old])) == ["b"]


# -- node-wide limit ---------------------------------------------------------------------------


def test_the_node_limit_keeps_an_equal_share_per_unit_then_drops_the_oldest() -> None:
    policy = GCPolicy(max_per_pod_container=-1, max_containers=4)
    web = [dead(f"w{i}", WEB, age=100 + i) for i in range(4)]  # w0 newest
    api = [dead(f"a{i}", API, age=10 + i) for i in range(4)]  # a0 newest, all newer than web
    result = plan([*web, *api], policy=policy)
    # 4 / 2 units = 2 each: the two newest of each unit stay.
    assert sorted(ids(result)) == ["a2", "a3", "w2", "w3"]


def test_past_the_share_the_oldest_go_across_units() -> None:
    policy = GCPolicy(max_per_pod_container=-1, max_containers=3)
    web = [dead(f"w{i}", WEB, age=100 + i) for i in range(3)]
    api = [dead(f"a{i}", API, age=10 + i) for i in range(3)]
    # Share 3 // 2 = 1 each leaves w0 and a0 (2 ≤ 3): nothing more to do.
    assert sorted(ids(plan([*web, *api], policy=policy))) == ["a1", "a2", "w1", "w2"]
    three = [*web, *api, *(dead(f"s{i}", API, "side", age=50 + i) for i in range(3))]
    policy = GCPolicy(max_per_pod_container=-1, max_containers=4)
    # Share 4 // 3 = 1 each: w0, a0, s0 stay (3 ≤ 4).
    assert sorted(ids(plan(three, policy=policy))) == ["a1", "a2", "s1", "s2", "w1", "w2"]


def test_the_node_limit_never_removes_a_protected_instance() -> None:
    policy = GCPolicy(max_containers=1)
    containers = [dead("w0", WEB, age=10), dead("a0", API, age=20), dead("s0", API, "side", age=30)]
    assert ids(plan(containers, policy=policy)) == []


def test_the_node_limit_drops_the_oldest_unprotected_first() -> None:
    policy = GCPolicy(max_per_pod_container=2, max_containers=3)
    containers = [dead("w0", WEB, age=10), dead("w1", WEB, age=300),
                  dead("a0", API, age=20), dead("a1", API, age=200)]
    # Share 3 // 2 = 1 each would leave 2; the share already drops both old ones.
    assert ids(plan(containers, policy=policy)) == ["w1", "a1"]


def test_dead_containers_younger_than_the_ttl_do_not_count_toward_the_limit() -> None:
    policy = GCPolicy(min_age=60, max_per_pod_container=-1, max_containers=1)
    containers = [dead("young0", age=5), dead("young1", age=6), dead("old0", age=100),
                  dead("old1", age=200)]
    assert ids(plan(containers, policy=policy)) == ["old1"]


# -- pods that are gone ------------------------------------------------------------------------


def test_every_dead_container_of_a_gone_pod_goes_but_not_a_running_or_young_one() -> None:
    containers = [dead("g0", GONE, age=30), dead("g1", GONE, age=20),
                  dead("g2", GONE, age=10, state=RUNNING), dead("g3", GONE, age=1)]
    assert ids(plan(containers, policy=GCPolicy(min_age=5))) == ["g0", "g1"]


def test_before_the_sources_are_ready_no_pod_counts_as_gone() -> None:
    containers = [dead("g0", GONE, age=30), dead("g1", GONE, age=20)]
    result = plan(containers, [sandbox("sb-old", GONE)], ready=False,
                  log_dirs=[f"default_gone_{GONE}"])
    assert ids(result) == ["g0"], "only what the per-container limit removes"
    assert result.sandboxes == () and result.log_dirs == ()


def test_containers_no_kubelet_made_are_never_chosen() -> None:
    stranger = GCContainer(id="x", pod_uid="", name="", state=EXITED, created_at=NOW - 1e6,
                           sandbox_id="sb-x")
    result = plan([stranger], [GCSandbox(id="sb-x", pod_uid="", state=NOTREADY, created_at=0)])
    assert result == GCPlan()


# -- sandboxes ---------------------------------------------------------------------------------


def test_an_existing_pod_keeps_its_newest_sandbox_and_any_in_use() -> None:
    sandboxes = [sandbox("sb3", age=10), sandbox("sb2", age=20), sandbox("sb1", age=30),
                 sandbox("sb0", age=40, state=READY)]
    containers = [dead("c2", sandbox="sb2", age=15)]
    result = plan(containers, sandboxes)
    # sb3 is the newest (kept though not ready), sb2 holds the kept dead container, sb0 is ready.
    assert [s.id for s in result.sandboxes] == ["sb1"]


def test_a_gone_pods_sandboxes_go_once_this_pass_empties_them() -> None:
    sandboxes = [sandbox("sb1", GONE, age=10), sandbox("sb0", GONE, age=40),
                 sandbox("sb-ready", GONE, age=5, state=READY)]
    containers = [dead("c0", GONE, sandbox="sb0"), dead("c1", GONE, sandbox="sb1")]
    result = plan(containers, sandboxes)
    assert ids(result) == ["c0", "c1"]
    assert [s.id for s in result.sandboxes] == ["sb0", "sb1"], "oldest first, never a ready one"


def test_a_sandbox_holding_a_container_that_stays_is_kept() -> None:
    sandboxes = [sandbox("sb0", GONE)]
    containers = [dead("young", GONE, sandbox="sb0", age=1)]
    assert plan(containers, sandboxes, policy=GCPolicy(min_age=60)).sandboxes == ()
    stranger = GCContainer(id="x", pod_uid="", name="", state=EXITED, created_at=0,
                           sandbox_id="sb0")
    assert plan([stranger], sandboxes).sandboxes == ()


# -- pod log directories -----------------------------------------------------------------------


def test_log_directories_of_gone_pods_without_sandboxes_are_removed() -> None:
    dirs = [f"default_web_{WEB}", f"default_gone_{GONE}", f"kube-system_dns_{API}",
            f"default_left_{'uid-left'}", "not-a-pod-dir", "a_b", "_x_y", "a_b_c_d"]
    sandboxes = [sandbox("sb-left", "uid-left", state=READY), sandbox("sb-gone", GONE)]
    result = plan([], sandboxes, log_dirs=dirs)
    assert [s.id for s in result.sandboxes] == ["sb-gone"]
    assert result.log_dirs == (f"default_gone_{GONE}",)


def test_log_dir_pod_uid() -> None:
    assert log_dir_pod_uid("ns_name_1234-abcd") == "1234-abcd"
    assert log_dir_pod_uid("ns_name") == ""
    assert log_dir_pod_uid("ns__uid") == ""
    assert log_dir_pod_uid("a_b_c_d") == ""


# -- properties --------------------------------------------------------------------------------

UIDS = ("p0", "p1", "p2", "p3")
NAMES = ("a", "b")


@st.composite
def runtimes(draw: st.DrawFn) -> tuple[list[GCContainer], list[GCSandbox]]:
    sandboxes = []
    for uid in draw(st.lists(st.sampled_from(UIDS), unique=True)):
        for n in range(draw(st.integers(1, 3))):
            sandboxes.append(GCSandbox(
                id=f"sb-{uid}-{n}", pod_uid=uid, state=draw(st.sampled_from([READY, NOTREADY])),
                created_at=NOW - draw(st.integers(0, 500)), attempt=n))
    containers = []
    for n in range(draw(st.integers(0, 40))):
        stray = draw(st.integers(0, 15)) == 0
        home = draw(st.sampled_from(sandboxes)) if sandboxes and not stray else None
        containers.append(GCContainer(
            id=f"c{n}", pod_uid=home.pod_uid if home else "", name=draw(st.sampled_from(NAMES)),
            state=draw(st.sampled_from(list(ContainerState))),
            created_at=NOW - draw(st.integers(0, 500)), attempt=draw(st.integers(0, 3)),
            sandbox_id=home.id if home else "sb-stray"))
    return containers, sandboxes


policies = st.builds(GCPolicy, min_age=st.sampled_from([0.0, 30.0, 200.0]),
                     max_per_pod_container=st.integers(-1, 3), max_containers=st.integers(-1, 8))


def newest_of(containers: Iterable[GCContainer]) -> dict[tuple[str, str], GCContainer]:
    newest: dict[tuple[str, str], GCContainer] = {}
    for c in containers:
        best = newest.get((c.pod_uid, c.name))
        if best is None or (c.created_at, c.attempt, c.id) > (
                best.created_at, best.attempt, best.id):
            newest[c.pod_uid, c.name] = c
    return newest


class Case:
    """One drawn input, its plan, and what stays."""

    def __init__(self, data: st.DataObject) -> None:
        self.containers, self.sandboxes = data.draw(runtimes())
        self.policy = data.draw(policies)
        self.existing = set(data.draw(st.lists(st.sampled_from(UIDS), unique=True)))
        self.ready = data.draw(st.booleans())
        self.dirs = [f"ns_pod_{uid}" for uid in UIDS]
        self.plan = plan_container_gc(
            self.containers, self.sandboxes, policy=self.policy, now=NOW,
            existing_pods=self.existing, sources_ready=self.ready, log_dirs=self.dirs)
        removed = {c.id for c in self.plan.containers}
        self.kept = [c for c in self.containers if c.id not in removed]
        gone_sandboxes = {s.id for s in self.plan.sandboxes}
        self.kept_sandboxes = [s for s in self.sandboxes if s.id not in gone_sandboxes]

    def gone(self, uid: str) -> bool:
        return self.ready and uid not in self.existing

    def evictable(self, c: GCContainer) -> bool:
        return (bool(c.pod_uid) and c.state is not RUNNING
                and c.created_at <= NOW - self.policy.min_age)

    def protected(self) -> set[str]:
        """Per existing pod and container: the newest dead and the newest exited instance."""
        owned = [c for c in self.containers
                 if c.pod_uid and c.state is not RUNNING and not self.gone(c.pod_uid)]
        exited = [c for c in owned if c.state is EXITED]
        return {c.id for c in (*newest_of(owned).values(), *newest_of(exited).values())}

    def units(self, containers: Iterable[GCContainer]) -> dict[tuple[str, str], list[GCContainer]]:
        """Evictable dead containers of existing pods, per unit."""
        units: dict[tuple[str, str], list[GCContainer]] = defaultdict(list)
        for c in containers:
            if self.evictable(c) and not self.gone(c.pod_uid):
                units[c.pod_uid, c.name].append(c)
        return units


PROPERTY_SETTINGS = settings(max_examples=400, deadline=None)


@PROPERTY_SETTINGS
@given(st.data())
def test_never_a_running_container_a_young_one_or_a_ready_or_used_sandbox(
    data: st.DataObject,
) -> None:
    case = Case(data)
    for c in case.plan.containers:
        assert case.evictable(c), c
    in_use = {c.sandbox_id for c in case.kept}
    for s in case.plan.sandboxes:
        assert s.state is NOTREADY and s.id not in in_use and s.pod_uid, s


@PROPERTY_SETTINGS
@given(st.data())
def test_existing_pods_keep_their_newest_dead_and_exited_instances(data: st.DataObject) -> None:
    case = Case(data)
    policy = case.policy
    protected = case.protected()
    kept_ids = {c.id for c in case.kept}
    assert protected <= kept_ids, "the newest dead and the newest exited one stay"
    before, after = case.units(case.containers), case.units(case.kept)
    for unit, instances in after.items():
        unprotected = [c for c in instances if c.id not in protected]
        if policy.max_per_pod_container >= 0:
            assert len(unprotected) <= policy.max_per_pod_container
        removed = [c for c in before[unit] if c.id not in kept_ids]
        if removed and unprotected:  # what went is older than what stayed for the limit
            assert max(c.created_at for c in removed) <= min(c.created_at for c in unprotected)
    for unit, instances in before.items():
        if policy.max_per_pod_container >= 1 and policy.max_containers < 0:
            kept = len(after.get(unit, []))
            assert kept >= min(len(instances), policy.max_per_pod_container)


@PROPERTY_SETTINGS
@given(st.data())
def test_the_node_limit_holds_when_enough_is_removable(data: st.DataObject) -> None:
    case = Case(data)
    if case.policy.max_containers < 0:
        return
    after = case.units(case.kept)
    protected = case.protected()
    total = sum(len(instances) for instances in after.values())
    kept_protected = sum(c.id in protected for instances in after.values() for c in instances)
    assert total <= max(case.policy.max_containers, kept_protected)


@PROPERTY_SETTINGS
@given(st.data())
def test_gone_pods_lose_every_evictable_container_and_log_dir(data: st.DataObject) -> None:
    case = Case(data)
    for c in case.kept:
        assert not (case.gone(c.pod_uid) and case.evictable(c)), c
    left = {c.pod_uid for c in case.kept} | {s.pod_uid for s in case.kept_sandboxes}
    expected = [d for d in case.dirs if case.gone(u := log_dir_pod_uid(d)) and u not in left]
    assert list(case.plan.log_dirs) == expected


@PROPERTY_SETTINGS
@given(st.data())
def test_a_second_pass_over_the_result_has_nothing_to_do(data: st.DataObject) -> None:
    case = Case(data)
    dirs = [d for d in case.dirs if d not in case.plan.log_dirs]
    again = plan_container_gc(
        case.kept, case.kept_sandboxes, policy=case.policy, now=NOW,
        existing_pods=case.existing, sources_ready=case.ready, log_dirs=dirs)
    assert not again, again

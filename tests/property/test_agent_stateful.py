"""The whole reconciler as a hypothesis state machine, against the fake runtime over a socket.

One example is one node: a `RecordingFake` runtime and an agent run on it (SyncLoop,
pod workers, PLEG relisting every second, the real CRI client), under trio's MockClock
in a background thread (see `agent_driver`). Rules change what the file source wants
(add, edit, remove, re-add a pod), break the world (a container crashes or is
OOM-killed, a sandbox dies), let virtual time pass, and restart the agent, cleanly or
by killing it right after one of its CRI calls; the new run must adopt what is there.

Checked by the fake at each call: at most one running instance per pod and container
name, attempt numbers only grow, no restart the policy forbids (any exited container
under Never, a succeeded one under OnFailure, a succeeded init container in the same
sandbox), and regular containers start only once the init containers have succeeded
in their sandbox. Checked after every step, at a quiescent point: the same on the CRI
state, one ready sandbox at most, restart counts never go down, phases only move
forward (Pending -> Running -> Succeeded/Failed), no status for pods nobody wants, and
a removed pod leaves nothing behind. When the steps are done the world stops changing
(every container runs or completes from then on) and every pod must reach the steady
state its policy and history call for, with nothing left for a further sync to do.

Known bugs, each shown by a strict xfail in test_agent_regressions.py, are tolerated
here through the ``TOLERATE_*`` switches below so this test can guard everything else.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from agent_driver import (
    CREATED,
    READY,
    RUNNING,
    RUNS,
    Behaviour,
    ContainerPlan,
    CriContainer,
    Node,
    PodPlan,
    Snapshot,
    TrioPortal,
    drop_pod,
    put_pod,
)
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from simulate import is_noop

from trio_kubelet.core.actions import compute_pod_actions, is_init_container_failed
from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.observed import ContainerState, RuntimePodStatus, SandboxState
from trio_kubelet.model.pod import Pod, is_sidecar
from trio_kubelet.runtime.cri.runtime import v1

MAX_PODS = 3
EXIT_AFTER = (0.5, 3.0, 12.0)
INIT_EXIT_AFTER = (0.5, 2.0)
REMOVAL_TIMEOUT = 30.0  # virtual seconds for a removed pod to be gone
# Crash-loop backoff tops out at 300 s; a container restarted just before the world
# stopped changing may wait that long, and then everything needs a few syncs.
CONVERGENCE_TIMEOUT = 700.0
CRI_METHODS = ("RunPodSandbox", "CreateContainer", "StartContainer", "StopContainer",
               "StopPodSandbox", "RemoveContainer", "RemovePodSandbox")
# A Never pod whose sandbox dies before every regular container has run stays Pending
# forever with nothing running (a known bug, shared with the Go kubelet:
# test_never_pod_whose_sandbox_dies_before_its_containers_run_does_not_hang in
# test_agent_regressions.py). Set to False once it is fixed.
TOLERATE_NEVER_POD_STUCK_PENDING = True
# A restarted agent has no status history for containers that have no instance (a new
# sandbox purged them): their restart counts read 0 and a Running pod may read Pending
# until they run again (a known bug: test_agent_restart_during_a_sandbox_re_creation_
# keeps_phase_and_restart_counts in test_agent_regressions.py). While it is tolerated,
# an agent restart forgets the history of such pods. Set to False once it is fixed.
TOLERATE_STATUS_RESET_ON_AGENT_RESTART = True
# A container left CREATED by an agent killed between CreateContainer and StartContainer
# is never removed, not even by a new sandbox's purge, and after a later agent restart
# it can roll a restart count back (a known bug: test_stale_created_sidecar_instance_does_
# not_roll_back_its_restart_count in test_agent_regressions.py). While it is tolerated,
# an agent restart also forgets the history of pods holding such an instance.
TOLERATE_STALE_CREATED_INSTANCES = True
PHASE_RANK = {"Pending": 0, "Running": 1, "Succeeded": 2, "Failed": 2}

# -- pod plans ----------------------------------------------------------------------------------

exits = st.builds(Behaviour, exit_after=st.sampled_from(EXIT_AFTER),
                  exit_code=st.sampled_from([0, 1]))
behaviours = st.one_of(st.just(RUNS), exits)
init_behaviours = st.builds(Behaviour, exit_after=st.sampled_from(INIT_EXIT_AFTER),
                            exit_code=st.sampled_from([0, 0, 1]))


@st.composite
def pod_plans(draw: st.DrawFn, name: str) -> PodPlan:
    count = draw(st.integers(1, 3))
    containers = tuple(ContainerPlan(f"c{i}", draw(behaviours)) for i in range(count))
    init = draw(st.none() | st.builds(ContainerPlan, st.just("init"), init_behaviours))
    sidecar = draw(st.none() | st.builds(ContainerPlan, st.just("side"), behaviours))
    return PodPlan(name=name, policy=draw(st.sampled_from(["Always", "OnFailure", "Never"])),
                   containers=containers, init=init, sidecar=sidecar,
                   sidecar_first=draw(st.booleans()))


# -- trio-side steps ----------------------------------------------------------------------------


def left_behind(snapshot: Snapshot, uid: str) -> list[str]:
    found = [f"container {c.name} ({c.state.name})" for c in snapshot.containers if c.uid == uid]
    found += [f"sandbox attempt {s.attempt}" for s in snapshot.sandboxes if s.uid == uid]
    if uid in snapshot.workers:
        found.append("a pod worker")
    if uid in snapshot.statuses:
        found.append("a status in the store")
    return found


async def wait_gone(node: Node, uid: str) -> list[str]:
    async def gone() -> bool:
        return not left_behind(node.snapshot(), uid)

    await node.wait_until(gone, REMOVAL_TIMEOUT)
    return left_behind(node.snapshot(), uid)


async def restart(node: Node, source_delay: float) -> None:
    """Start a new agent run on the same runtime; the source reports after ``source_delay``."""
    await node.stop_agent()
    await node.start_agent()
    if source_delay:
        await node.advance(source_delay)  # PLEG relists first: the pods are unclaimed
    await node.publish()


def not_adopted(node: Node, running: dict[str, CriContainer], stopped: set[str]) -> list[str]:
    """Containers of live pods that ran before an agent restart and the new agent stopped.

    A container stops legitimately only when its pod finished (no regular container runs
    any more), which may happen while the new agent waits for its pod source.
    """
    live_pods = {c.uid for c in node.fake.cri_containers()
                 if c.state == RUNNING and c.kind == "regular"}
    return [f"{c.name} of pod {c.uid}" for c in running.values()
            if c.id in stopped and c.uid in live_pods]


# -- the steady state ---------------------------------------------------------------------------


def steady_state_problems(pod: Pod, runtime: RuntimePodStatus, phase: str | None) -> list[str]:
    """What keeps ``pod`` from the steady state its policy and history call for."""
    spec, policy = pod.spec, pod.spec.restart_policy
    problems: list[str] = []

    def newest(name: str) -> str:
        found = runtime.find(name)
        return "none" if found is None else f"{found.state.value} ({found.exit_code})"

    init_failed = any(
        (found := runtime.find(c.name)) is not None and found.state is ContainerState.EXITED
        and is_init_container_failed(found)
        for c in spec.init_containers if not is_sidecar(c))
    regular = [runtime.find(c.name) for c in spec.containers]
    running = [c for c in regular if c is not None and c.state is ContainerState.RUNNING]
    ready = [s for s in runtime.sandboxes if s.state is SandboxState.READY]
    if policy == "Never" and init_failed:
        expected = "Failed"
    elif (TOLERATE_NEVER_POD_STUCK_PENDING and policy == "Never" and None in regular
          and not ready and not any(c.state is ContainerState.RUNNING
                                    for c in runtime.containers)):
        return []  # the known bug: accept the pod as it is
    else:
        for container, found in zip(spec.containers, regular, strict=True):
            ok = found is not None and (
                found.state is ContainerState.RUNNING
                or (policy == "OnFailure" and found.state is ContainerState.EXITED
                    and found.exit_code == 0)
                or (policy == "Never" and found.state is ContainerState.EXITED))
            if not ok:
                problems.append(f"{container.name} should run or have finished under "
                                f"{policy}, newest is {newest(container.name)}")
        for init in spec.init_containers:
            found = runtime.find(init.name)
            if not is_sidecar(init) and regular and (
                    found is None or found.state is not ContainerState.EXITED
                    or found.exit_code != 0):
                problems.append(f"init container {init.name} should have succeeded, newest "
                                f"is {newest(init.name)}")
        if running:
            expected = "Running"
        elif all(c is not None and c.exit_code == 0 for c in regular):
            expected = "Succeeded"
        else:
            expected = "Failed"
    if problems:
        return problems
    actions = compute_pod_actions(pod, runtime)
    if expected == "Running":
        if len(ready) != 1:
            problems.append(f"a running pod should have one ready sandbox, has {len(ready)}")
        for sidecar in (c for c in spec.init_containers if is_sidecar(c)):
            if newest(sidecar.name).split()[0] != "running":
                problems.append(f"sidecar {sidecar.name} should run, newest is "
                                f"{newest(sidecar.name)}")
        for container in [*spec.containers, *(c for c in spec.init_containers if is_sidecar(c))]:
            found = runtime.find(container.name)
            if (found is not None and found.state is ContainerState.RUNNING
                    and found.spec_hash != container_hash(container)):
                problems.append(f"{container.name} runs an outdated spec")
        if not is_noop(actions):
            problems.append(f"a further sync would still act: {actions.reasons}")
    else:
        live = [c.name for c in runtime.containers if c.state is ContainerState.RUNNING]
        if live:
            problems.append(f"a {expected} pod still runs {live}")
        if ready:
            problems.append(f"a {expected} pod still has a ready sandbox")
        if (actions.create_sandbox or actions.containers_to_start
                or actions.init_containers_to_start or actions.containers_to_kill):
            problems.append(f"a further sync of a finished pod would act: {actions.reasons}")
    if phase != expected:
        problems.append(f"phase is {phase}, expected {expected}")
    return problems


async def converge(node: Node) -> dict[str, list[str]]:
    """The world stops changing; return what keeps each pod from its steady state."""
    for pod in node.desired.values():
        spec = pod.spec
        for container in [*spec.init_containers, *spec.containers]:
            sidecar_or_regular = is_sidecar(container) or container in spec.containers
            behaviour = RUNS if sidecar_or_regular else Behaviour(exit_after=0.5)
            node.fake.script(pod.metadata.name, container.name, behaviour.script())
    await node.advance(max(EXIT_AFTER) + 1)  # instances already running exit as planned
    problems: dict[str, list[str]] = {}

    async def steady() -> bool:
        problems.clear()
        assert node.agent is not None
        for uid, pod in node.desired.items():
            stored = node.agent.store.get(uid)
            phase = stored.status.phase if stored is not None else None
            found = steady_state_problems(pod, await node.inspect(uid), phase)
            if found:
                problems[pod.metadata.name] = found
        return not problems

    await node.wait_until(steady, CONVERGENCE_TIMEOUT, step=2.0)
    return dict(problems)


# -- the state machine --------------------------------------------------------------------------


class AgentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.plans: dict[str, PodPlan] = {}  # the pods the source wants, by manifest name
        self.uids: dict[str, str] = {}
        self.removed: dict[str, PodPlan] = {}  # removed pods, which may come back
        self.gone: set[str] = set()  # UIDs of removed pods: nothing of them may remain
        self.phases: dict[str, str] = {}
        self.restarts: dict[tuple[str, str], int] = {}
        self.next_pod = 0
        self.failed = False
        self.portal = TrioPortal()
        self.portal.call(lambda node: node.start_agent())
        self.portal.call(lambda node: node.publish())

    @contextmanager
    def step(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self.failed = True
            raise

    def forget_history(self, uid: str) -> None:
        self.phases.pop(uid, None)
        self.restarts = {k: v for k, v in self.restarts.items() if k[0] != uid}

    def after_agent_restart(self) -> None:
        """Forget the history the known bugs let a restarted agent lose (see TOLERATE_*)."""
        snapshot = self.portal.call(lambda node: _async(node.snapshot()))
        for name, plan in self.plans.items():
            uid = self.uids[name]
            mine = [c for c in snapshot.containers if c.uid == uid]
            purged = {c.name for c in plan.every_container()} - {c.name for c in mine}
            stale = any(c.state == CREATED for c in mine)
            if ((TOLERATE_STATUS_RESET_ON_AGENT_RESTART and purged)
                    or (TOLERATE_STALE_CREATED_INSTANCES and stale)):
                self.forget_history(uid)

    # -- what the source wants -----------------------------------------------------------

    # Rules that cannot apply do nothing (rather than having preconditions, which make
    # hypothesis give up on examples when it draws disabled rules a few times in a row).

    @initialize(data=st.data(), count=st.integers(1, MAX_PODS))
    def first_pods(self, data: st.DataObject, count: int) -> None:
        """Every example starts with pods (hypothesis likes short examples without any)."""
        for _ in range(count):
            self.add_pod(data)

    @rule(data=st.data())
    def add_pod(self, data: st.DataObject) -> None:
        with self.step():
            if len(self.plans) >= MAX_PODS:
                return
            name = f"p{self.next_pod}"
            self.next_pod += 1
            plan = data.draw(pod_plans(name), label="pod")
            self.plans[name] = plan
            self.uids[name] = self.portal.call(lambda node: put_pod(node, plan))

    @rule(data=st.data())
    def edit_pod(self, data: st.DataObject) -> None:
        with self.step():
            if not self.plans:
                return
            name = data.draw(st.sampled_from(sorted(self.plans)), label="pod")
            plan = self.plans[name]
            container = data.draw(st.sampled_from(plan.every_container()), label="container")
            is_init = container is plan.init
            behaviour = data.draw(init_behaviours if is_init else behaviours, label="behaviour")
            plan = plan.with_container(
                replace(container, behaviour=behaviour, version=container.version + 1))
            self.plans[name] = plan
            self.portal.call(lambda node: put_pod(node, plan))

    @rule(data=st.data(), back_at_once=st.booleans())
    def remove_pod(self, data: st.DataObject, back_at_once: bool) -> None:
        with self.step():
            if not self.plans:
                return
            name = data.draw(st.sampled_from(sorted(self.plans)), label="pod")
            uid, plan = self.uids[name], self.plans[name]
            if back_at_once:  # the manifest is deleted and written again before a relist
                async def flap(node: Node) -> None:
                    await drop_pod(node, uid)
                    await put_pod(node, plan)

                self.portal.call(flap)
                self.forget_history(uid)
                return
            del self.plans[name]
            self.removed[name] = plan
            self.gone.add(uid)
            self.forget_history(uid)

            async def remove(node: Node) -> list[str]:
                await drop_pod(node, uid)
                return await wait_gone(node, uid)

            remains = self.portal.call(remove)
            assert not remains, f"removed pod {name} left {remains} after {REMOVAL_TIMEOUT}s"

    @rule(data=st.data())
    def readd_pod(self, data: st.DataObject) -> None:
        with self.step():
            if not self.removed or len(self.plans) >= MAX_PODS:
                return
            name = data.draw(st.sampled_from(sorted(self.removed)), label="pod")
            plan = self.removed.pop(name)
            self.plans[name] = plan
            self.gone.discard(self.uids[name])
            self.portal.call(lambda node: put_pod(node, plan))

    # -- the world -----------------------------------------------------------------------

    def _pick_container(self, data: st.DataObject) -> str | None:
        snapshot = self.portal.call(lambda node: _async(node.snapshot()))
        running = sorted(c.id for c in snapshot.containers if c.state == RUNNING)
        if not running:
            return None
        return data.draw(st.sampled_from(running), label="container id")

    @rule(data=st.data(), exit_code=st.sampled_from([0, 1, 2]))
    def crash_container(self, data: st.DataObject, exit_code: int) -> None:
        with self.step():
            container_id = self._pick_container(data)
            if container_id is not None:
                self.portal.call(lambda node: _async(node.fake.crash(container_id, exit_code)))

    @rule(data=st.data())
    def oom_kill_container(self, data: st.DataObject) -> None:
        with self.step():
            container_id = self._pick_container(data)
            if container_id is not None:
                self.portal.call(lambda node: _async(node.fake.oom_kill(container_id)))

    @rule(data=st.data())
    def sandbox_dies(self, data: st.DataObject) -> None:
        with self.step():
            snapshot = self.portal.call(lambda node: _async(node.snapshot()))
            ready = sorted(s.id for s in snapshot.sandboxes if s.state == READY)
            if not ready:
                return
            sandbox_id = data.draw(st.sampled_from(ready), label="sandbox id")

            async def kill(node: Node) -> None:
                node.fake.stop_pod_sandbox(v1.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))

            self.portal.call(kill)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 5.0, 15.0, 40.0]))
    def let_time_pass(self, seconds: float) -> None:
        with self.step():
            self.portal.call(lambda node: node.advance(seconds))

    # -- the agent -----------------------------------------------------------------------

    @rule(source_delay=st.sampled_from([0.0, 2.5]), data=st.data())
    def restart_agent(self, source_delay: float, data: st.DataObject) -> None:
        """Stop and start the agent; maybe a manifest was deleted meanwhile."""
        with self.step():
            dropped = None
            if self.plans and data.draw(st.booleans(), label="remove a pod while down"):
                dropped = data.draw(st.sampled_from(sorted(self.plans)), label="pod")

            async def bounce(node: Node) -> tuple[list[str], list[str]]:
                await node.stop_agent()
                if dropped is not None:
                    await drop_pod(node, self.uids[dropped], publish=False)
                running = {c.id: c for c in node.fake.cri_containers()
                           if c.state == RUNNING and c.uid in node.desired}
                stopped_before = set(node.fake.stopped_running)
                await restart(node, source_delay)
                adopted = not_adopted(node, running, node.fake.stopped_running - stopped_before)
                return adopted, await wait_gone(node, self.uids[dropped]) if dropped else []

            not_kept, remains = self.portal.call(bounce)
            self.after_agent_restart()
            assert not not_kept, f"the restarted agent stopped live containers: {not_kept}"
            if dropped is not None:
                self.removed[dropped] = self.plans.pop(dropped)
                self.gone.add(self.uids[dropped])
                self.forget_history(self.uids[dropped])
                assert not remains, f"pod {dropped}, removed while the agent was down, left " \
                                    f"{remains}"

    @rule(method=st.sampled_from(CRI_METHODS), source_delay=st.sampled_from([0.0, 2.5]))
    def agent_dies_after_a_cri_call(self, method: str, source_delay: float) -> None:
        """The agent is killed right after the runtime carried out one of its calls."""
        with self.step():
            if not self.plans:
                return
            async def crash(node: Node) -> None:
                agent = node.agent
                assert agent is not None
                node.crash_agent_at(method)

                async def died() -> bool:
                    return agent.done.is_set()

                await node.wait_until(died, 20.0)
                await restart(node, source_delay)

            self.portal.call(crash)
            self.after_agent_restart()

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def agent_keeps_the_rules(self) -> None:
        with self.step():
            snapshot = self.portal.call(lambda node: _async(node.snapshot()))
            assert not snapshot.violations, snapshot.violations
            self._check_containers(snapshot)
            self._check_statuses(snapshot)
            for uid in self.gone:
                remains = left_behind(snapshot, uid)
                assert not remains, f"removed pod {uid} still has {remains}"

    def _check_containers(self, snapshot: Snapshot) -> None:
        running: set[tuple[str, str]] = set()
        attempts: set[tuple[str, str, int]] = set()
        for c in snapshot.containers:
            if c.state == RUNNING:
                assert (c.uid, c.name) not in running, f"two running {c.name} in pod {c.uid}"
                running.add((c.uid, c.name))
            key = (c.uid, c.name, c.attempt)
            assert key not in attempts, f"two instances of {key}"
            attempts.add(key)
        ready: set[str] = set()
        for s in snapshot.sandboxes:
            if s.state == READY:
                assert s.uid not in ready, f"two ready sandboxes for pod {s.uid}"
                ready.add(s.uid)

    def _check_statuses(self, snapshot: Snapshot) -> None:
        wanted = {self.uids[name] for name in self.plans}
        stray = set(snapshot.statuses) - wanted
        assert not stray, f"statuses of pods no source wants: {stray}"
        for uid, status in snapshot.statuses.items():
            for container in (*status.init_container_statuses, *status.container_statuses):
                key = (uid, container.name)
                before = self.restarts.get(key, 0)
                assert container.restart_count >= before, (
                    f"restart count of {container.name} in {uid} went {before} -> "
                    f"{container.restart_count}")
                self.restarts[key] = container.restart_count
            before_phase = self.phases.get(uid)
            if before_phase is not None:
                assert PHASE_RANK[status.phase] >= PHASE_RANK[before_phase], (
                    f"phase of {uid} went {before_phase} -> {status.phase}")
                if PHASE_RANK[before_phase] == 2:
                    assert status.phase == before_phase, (
                        f"terminal phase of {uid} went {before_phase} -> {status.phase}")
            self.phases[uid] = status.phase

    def teardown(self) -> None:
        try:
            if not self.failed:
                problems = self.portal.call(converge)
                # The rules the fake checks at each call hold while converging too.
                self.agent_keeps_the_rules()
                assert not problems, f"no steady state: {problems}"
        finally:
            self.portal.close()


async def _async(value: object) -> object:
    return value


# CI runs a quick pass; set TRIO_KUBELET_AGENT_EXAMPLES (and _STEPS) for a deep one.
AgentMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("TRIO_KUBELET_AGENT_EXAMPLES", "20")),
    stateful_step_count=int(os.environ.get("TRIO_KUBELET_AGENT_STEPS", "15")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TestAgentStateMachine = AgentMachine.TestCase

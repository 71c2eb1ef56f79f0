"""compute_pod_actions against the Go kubelet's computePodActions table cases, restated.

Each case is named after its Go counterpart in kuberuntime_manager_test.go
(TestComputePodActions, …WithInitContainers, …WithRestartableInitContainers,
…WithInitAndEphemeralContainers); as there, kill messages are checked separately.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from trio_kubelet.core.actions import (
    REASON_LIVENESS_PROBE,
    REASON_STARTUP_PROBE,
    REASON_UNKNOWN,
    PodActions,
    compute_pod_actions,
    pod_sandbox_changed,
    should_container_be_restarted,
)
from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.model.pod import Container, Pod

RUNNING = ContainerState.RUNNING
EXITED = ContainerState.EXITED
CREATED = ContainerState.CREATED
UNKNOWN = ContainerState.UNKNOWN
SUCCESS = ProbeResult.SUCCESS
FAILURE = ProbeResult.FAILURE
PROBE = {"exec": {"command": ["true"]}}

# -- builders --------------------------------------------------------------------------


def spec_container(name: str, image: str = "busybox", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, **extra}


def sidecar(name: str, probes: bool = False, image: str = "bar-image") -> dict[str, Any]:
    extra: dict[str, Any] = {"restartPolicy": "Always"}
    if probes:
        extra |= {"livenessProbe": PROBE, "startupProbe": PROBE}
    return spec_container(name, image, **extra)


def make_pod(
    containers: Sequence[dict[str, Any]] | None = None,
    init: Sequence[dict[str, Any]] = (),
    ephemeral: Sequence[dict[str, Any]] = (),
    policy: str = "Always",
    **spec: Any,
) -> Pod:
    if containers is None:
        containers = [spec_container(f"foo{i}") for i in (1, 2, 3)]
    return Pod.model_validate({
        "metadata": {"name": "foo", "namespace": "foo-ns", "uid": "12345678"},
        "spec": {
            "containers": list(containers),
            "initContainers": list(init),
            "ephemeralContainers": list(ephemeral),
            "restartPolicy": policy,
            **spec,
        },
    })


def find_spec(pod: Pod, name: str) -> Container:
    spec = pod.spec
    for container in (*spec.init_containers, *spec.containers, *spec.ephemeral_containers):
        if container.name == name:
            return container
    raise KeyError(name)


def instance(
    pod: Pod,
    name: str,
    container_id: str,
    state: ContainerState = RUNNING,
    exit_code: int = 0,
    spec_hash: str | None = None,
    reason: str = "",
) -> RuntimeContainer:
    return RuntimeContainer(
        id=container_id,
        name=name,
        state=state,
        exit_code=exit_code,
        reason=reason,
        spec_hash=container_hash(find_spec(pod, name)) if spec_hash is None else spec_hash,
    )


def sandbox(
    state: SandboxState = SandboxState.READY,
    attempt: int = 0,
    ip: str = "10.0.0.1",
    sandbox_id: str = "sandboxID",
    host_network: bool = False,
) -> RuntimeSandbox:
    return RuntimeSandbox(id=sandbox_id, state=state, attempt=attempt, ip=ip,
                          host_network=host_network)


def runtime(
    containers: Sequence[RuntimeContainer], sandboxes: Sequence[RuntimeSandbox] | None = None
) -> RuntimePodStatus:
    return RuntimePodStatus(
        uid="12345678", name="foo", namespace="foo-ns",
        sandboxes=tuple([sandbox()] if sandboxes is None else sandboxes),
        containers=tuple(containers),
    )


@dataclass
class Expect:
    """The fields of PodActions a case checks (kill messages are checked elsewhere)."""

    kill_pod: bool = False
    create_sandbox: bool = False
    sandbox_id: str = "sandboxID"
    attempt: int = 0
    init: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    kill: dict[str, str] = field(default_factory=dict)
    ephemeral: list[int] = field(default_factory=list)

    @staticmethod
    def of(actions: PodActions) -> Expect:
        return Expect(
            kill_pod=actions.kill_pod,
            create_sandbox=actions.create_sandbox,
            sandbox_id=actions.sandbox_id,
            attempt=actions.attempt,
            init=actions.init_containers_to_start,
            start=actions.containers_to_start,
            kill={cid: k.name for cid, k in actions.containers_to_kill.items()},
            ephemeral=actions.ephemeral_containers_to_start,
        )


NO_ACTION = Expect()


@dataclass
class Scenario:
    pod: Pod
    status: RuntimePodStatus
    liveness: dict[str, ProbeResult] = field(default_factory=dict)
    startup: dict[str, ProbeResult] = field(default_factory=dict)

    def actions(self) -> PodActions:
        return compute_pod_actions(self.pod, self.status, liveness=self.liveness,
                                   startup=self.startup)


def run_table(build: Callable[[], Scenario], mutate: Callable[[Scenario], None], want: Expect
              ) -> PodActions:
    scenario = build()
    mutate(scenario)
    actions = scenario.actions()
    assert Expect.of(actions) == want
    return actions


def replace_containers(scenario: Scenario, containers: Sequence[RuntimeContainer]) -> None:
    scenario.status = runtime(containers, scenario.status.sandboxes)


def with_state(
    scenario: Scenario, index: int, state: ContainerState, exit_code: int = 0, **extra: Any
) -> None:
    containers = list(scenario.status.containers)
    old = containers[index]
    containers[index] = RuntimeContainer(
        id=old.id, name=old.name, state=state, exit_code=exit_code,
        spec_hash=extra.get("spec_hash", old.spec_hash),
    )
    replace_containers(scenario, containers)


def with_sandbox(scenario: Scenario, **changes: Any) -> None:
    scenario.status = runtime(scenario.status.containers, [sandbox(**changes)])


def with_policy(scenario: Scenario, policy: str) -> None:
    scenario.pod = scenario.pod.model_copy(
        update={"spec": scenario.pod.spec.model_copy(update={"restart_policy": policy})})


def chain(*steps: Callable[[Scenario], None]) -> Callable[[Scenario], None]:
    def run(scenario: Scenario) -> None:
        for step in steps:
            step(scenario)
    return run


def policy(name: str) -> Callable[[Scenario], None]:
    return lambda s: with_policy(s, name)


def state(index: int, st: ContainerState, exit_code: int = 0) -> Callable[[Scenario], None]:
    return lambda s: with_state(s, index, st, exit_code)


def exit_code(index: int, code: int) -> Callable[[Scenario], None]:
    return lambda s: with_state(s, index, s.status.containers[index].state, code)


def sandbox_dead(attempt: int = 0) -> Callable[[Scenario], None]:
    return lambda s: with_sandbox(s, state=SandboxState.NOTREADY, attempt=attempt)


def keep_only(start: int | None = None, stop: int | None = None) -> Callable[[Scenario], None]:
    return lambda s: replace_containers(s, s.status.containers[start:stop])


def nothing(_: Scenario) -> None:
    return None


# -- TestComputePodActions ---------------------------------------------------------------


def base() -> Scenario:
    pod = make_pod()
    return Scenario(pod, runtime([instance(pod, f"foo{i}", f"id{i}") for i in (1, 2, 3)]))


def all_exited(code: int) -> Callable[[Scenario], None]:
    return chain(*(state(i, EXITED, code) for i in range(3)))


BASIC_CASES: dict[str, tuple[Callable[[Scenario], None], Expect]] = {
    "everything is good; do nothing": (nothing, NO_ACTION),
    "start pod sandbox and all containers for a new pod": (
        lambda s: setattr(s, "status", runtime([], [])),
        Expect(kill_pod=True, create_sandbox=True, sandbox_id="", start=[0, 1, 2]),
    ),
    "restart exited containers if RestartPolicy == Always": (
        chain(policy("Always"), state(0, EXITED, 0), state(1, EXITED, 111)),
        Expect(start=[0, 1]),
    ),
    "restart failed containers if RestartPolicy == OnFailure": (
        chain(policy("OnFailure"), state(0, EXITED, 0), state(1, EXITED, 111)),
        Expect(start=[1]),
    ),
    "restart created but not started containers if RestartPolicy == OnFailure": (
        chain(policy("OnFailure"), state(0, EXITED, 0), state(1, CREATED)),
        Expect(start=[1]),
    ),
    "don't restart containers if RestartPolicy == Never": (
        chain(policy("Never"), state(0, EXITED, 0), state(1, EXITED, 111)),
        NO_ACTION,
    ),
    "Kill pod and recreate everything if the pod sandbox is dead, and RestartPolicy == Always": (
        chain(policy("Always"), sandbox_dead()),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, start=[0, 1, 2]),
    ),
    "Kill pod and recreate all containers (except for the succeeded one) if the pod sandbox "
    "is dead, and RestartPolicy == OnFailure": (
        chain(policy("OnFailure"), sandbox_dead(), state(1, EXITED, 0)),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, start=[0, 2]),
    ),
    "Kill pod and recreate all containers if the PodSandbox does not have an IP": (
        lambda s: with_sandbox(s, ip=""),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, start=[0, 1, 2]),
    ),
    "Kill and recreate the container if the container's spec changed": (
        chain(policy("Always"), lambda s: with_state(s, 1, RUNNING, spec_hash="432423432")),
        Expect(kill={"id2": "foo2"}, start=[1]),
    ),
    "Kill and recreate the container if the liveness check has failed": (
        chain(policy("Always"), lambda s: s.liveness.update(id2=FAILURE)),
        Expect(kill={"id2": "foo2"}, start=[1]),
    ),
    "Kill and recreate the container if the startup check has failed": (
        chain(policy("Always"), lambda s: s.startup.update(id2=FAILURE)),
        Expect(kill={"id2": "foo2"}, start=[1]),
    ),
    "Verify we do not create a pod sandbox if no ready sandbox for pod with RestartPolicy=Never "
    "and all containers exited": (
        chain(policy("Never"), sandbox_dead(attempt=1), all_exited(0)),
        Expect(kill_pod=True, attempt=2),
    ),
    "Verify we do not create a pod sandbox if no ready sandbox for pod with "
    "RestartPolicy=OnFailure and all containers succeeded": (
        chain(policy("OnFailure"), sandbox_dead(attempt=1), all_exited(0)),
        Expect(kill_pod=True, attempt=2),
    ),
    "Verify we create a pod sandbox if no ready sandbox for pod with RestartPolicy=Never and "
    "no containers have ever been created": (
        chain(policy("Never"), sandbox_dead(attempt=2), keep_only(0, 0)),
        Expect(kill_pod=True, create_sandbox=True, attempt=3, start=[0, 1, 2]),
    ),
    "Kill and recreate the container if the container is in unknown state": (
        chain(policy("Never"), state(1, UNKNOWN)),
        Expect(kill={"id2": "foo2"}, start=[1]),
    ),
    "Restart the container if the container is in created state": (
        chain(policy("Never"), state(1, CREATED)),
        Expect(start=[1]),
    ),
    # Newer Go behaviour (reference §1 and §2.7), not in the older table.
    "Kill pod and recreate all containers if the sandbox network mode changed": (
        lambda s: with_sandbox(s, host_network=True, ip=""),
        Expect(kill_pod=True, create_sandbox=True, sandbox_id="", attempt=1, start=[0, 1, 2]),
    ),
    "Kill pod and recreate all containers if more than one sandbox is ready": (
        lambda s: setattr(s, "status", runtime(
            s.status.containers,
            [sandbox(attempt=1, sandbox_id="sandboxID"), sandbox(sandbox_id="older")])),
        Expect(kill_pod=True, create_sandbox=True, attempt=2, start=[0, 1, 2]),
    ),
    "Kill pod if every container exited and none may restart (RestartPolicy == Never)": (
        chain(policy("Never"), all_exited(1)),
        Expect(kill_pod=True),
    ),
}


@pytest.mark.parametrize("mutate, want", BASIC_CASES.values(), ids=BASIC_CASES.keys())
def test_compute_pod_actions(mutate: Callable[[Scenario], None], want: Expect) -> None:
    run_table(base, mutate, want)


# -- TestComputePodActionsWithInitContainers ---------------------------------------------


def base_with_init() -> Scenario:
    pod = make_pod(init=[spec_container(f"init{i}", "bar-image") for i in (1, 2, 3)])
    return Scenario(pod, runtime([instance(pod, f"init{i}", f"initid{i}", EXITED)
                                  for i in (1, 2, 3)]))


INIT_CASES: dict[str, tuple[Callable[[Scenario], None], Expect]] = {
    "initialization completed; start all containers": (nothing, Expect(start=[0, 1, 2])),
    "no init containers have been started; start the first one": (
        keep_only(0, 0), Expect(init=[0])),
    "initialization in progress; do nothing": (
        chain(policy("Always"), state(2, RUNNING)), NO_ACTION),
    "Kill pod and restart the first init container if the pod sandbox is dead": (
        chain(policy("Always"), sandbox_dead()),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "initialization failed; restart the last init container if RestartPolicy == Always": (
        chain(policy("Always"), exit_code(2, 137)), Expect(init=[2])),
    "initialization failed; restart the last init container if RestartPolicy == OnFailure": (
        chain(policy("OnFailure"), exit_code(2, 137)), Expect(init=[2])),
    "initialization failed; kill pod if RestartPolicy == Never": (
        chain(policy("Never"), exit_code(2, 137)), Expect(kill_pod=True)),
    "init container state unknown; kill and recreate the last init container if "
    "RestartPolicy == Always": (
        chain(policy("Always"), state(2, UNKNOWN)),
        Expect(init=[2], kill={"initid3": "init3"}),
    ),
    "init container state unknown; kill and recreate the last init container if "
    "RestartPolicy == OnFailure": (
        chain(policy("OnFailure"), state(2, UNKNOWN)),
        Expect(init=[2], kill={"initid3": "init3"}),
    ),
    "init container state unknown; kill pod if RestartPolicy == Never": (
        chain(policy("Never"), state(2, UNKNOWN)), Expect(kill_pod=True)),
    "Pod sandbox not ready, init container failed, but RestartPolicy == Never; kill pod only": (
        chain(policy("Never"), sandbox_dead()), Expect(kill_pod=True, attempt=1)),
    "Pod sandbox not ready, and RestartPolicy == Never, but no visible init containers;  "
    "create a new pod sandbox": (
        chain(policy("Never"), sandbox_dead(), keep_only(0, 0)),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "Pod sandbox not ready, init container failed, and RestartPolicy == OnFailure; create a "
    "new pod sandbox": (
        chain(policy("OnFailure"), sandbox_dead(), exit_code(2, 137)),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "some of the init container statuses are missing but the last init container is running, "
    "don't restart preceding ones": (
        chain(policy("Always"), state(2, RUNNING), keep_only(2)), NO_ACTION),
    "an init container is in the created state due to an unknown error when starting "
    "container; restart it": (
        chain(policy("Always"), state(2, CREATED)), Expect(init=[2])),
}


@pytest.mark.parametrize("mutate, want", INIT_CASES.values(), ids=INIT_CASES.keys())
def test_compute_pod_actions_with_init_containers(
    mutate: Callable[[Scenario], None], want: Expect
) -> None:
    run_table(base_with_init, mutate, want)


# -- TestComputePodActionsWithRestartableInitContainers ----------------------------------


def base_with_sidecars() -> Scenario:
    pod = make_pod(init=[
        sidecar("restartable-init-1"),
        sidecar("restartable-init-2", probes=True),
        sidecar("restartable-init-3", probes=True),
    ])
    containers = [instance(pod, f"restartable-init-{i}", f"initid{i}") for i in (1, 2, 3)]
    results = {"initid2": SUCCESS, "initid3": SUCCESS}
    return Scenario(pod, runtime(containers), liveness=dict(results), startup=dict(results))


def regular_instances(state_: ContainerState, code: int = 0) -> Callable[[Scenario], None]:
    def add(s: Scenario) -> None:
        extra = [instance(s.pod, f"foo{i}", f"id{i}", state_, code) for i in (1, 2, 3)]
        replace_containers(s, [*s.status.containers, *extra])
    return add


def change_sidecar_image(s: Scenario) -> None:
    spec = s.pod.spec
    init = list(spec.init_containers)
    init[2] = init[2].model_copy(update={"image": "foo-image"})
    s.pod = s.pod.model_copy(update={"spec": spec.model_copy(update={"init_containers": init})})


SIDECAR_CASES: dict[str, tuple[Callable[[Scenario], None], Expect]] = {
    "initialization completed; start all containers": (nothing, Expect(start=[0, 1, 2])),
    "no init containers have been started; start the first one": (
        keep_only(0, 0), Expect(init=[0])),
    "an init container is stuck in the created state; restart it": (
        chain(policy("Always"), state(2, CREATED)), Expect(init=[2])),
    "restartable init container has started; start the next": (
        chain(policy("Always"), keep_only(0, 1)), Expect(init=[1])),
    "livenessProbe has not been run; start the nothing": (
        chain(policy("Always"), lambda s: s.liveness.pop("initid2"), keep_only(0, 2)),
        Expect(init=[2]),
    ),
    "livenessProbe in progress; start the next": (
        chain(policy("Always"), lambda s: s.liveness.update(initid2=ProbeResult.UNKNOWN),
              keep_only(0, 2)),
        Expect(init=[2]),
    ),
    "livenessProbe has completed; start the next": (
        chain(policy("Always"), keep_only(0, 2)), Expect(init=[2])),
    "kill and recreate the restartable init container if the liveness check has failed": (
        chain(policy("Always"), lambda s: s.liveness.update(initid3=FAILURE)),
        Expect(init=[2], kill={"initid3": "restartable-init-3"}, start=[0, 1, 2]),
    ),
    "startupProbe has not been run; do nothing": (
        chain(policy("Always"), lambda s: s.startup.pop("initid2"), keep_only(0, 2)),
        NO_ACTION,
    ),
    "startupProbe in progress; do nothing": (
        chain(policy("Always"), lambda s: s.startup.update(initid2=ProbeResult.UNKNOWN),
              keep_only(0, 2)),
        NO_ACTION,
    ),
    "startupProbe has completed; start the next": (
        chain(policy("Always"), keep_only(0, 2)), Expect(init=[2])),
    "kill and recreate the restartable init container if the startup check has failed": (
        chain(policy("Always"), lambda s: s.startup.update(initid3=FAILURE)),
        Expect(init=[2], kill={"initid3": "restartable-init-3"}),
    ),
    "kill and recreate the restartable init container if the container definition changes": (
        chain(policy("Always"), change_sidecar_image),
        Expect(init=[2], kill={"initid3": "restartable-init-3"}, start=[0, 1, 2]),
    ),
    "restart terminated restartable init container and next init container": (
        chain(policy("Always"), state(0, EXITED), state(2, EXITED)), Expect(init=[0, 2])),
    "restart terminated restartable init container and regular containers": (
        chain(policy("Always"), state(0, EXITED)), Expect(init=[0], start=[0, 1, 2])),
    "Pod sandbox not ready, restartable init container failed, but RestartPolicy == Never; "
    "kill pod only": (
        chain(policy("Never"), sandbox_dead(), state(2, EXITED, 137)),
        Expect(kill_pod=True, attempt=1),
    ),
    "Pod sandbox not ready, and RestartPolicy == Never, but no visible restartable init "
    "containers;  create a new pod sandbox": (
        chain(policy("Never"), sandbox_dead(), keep_only(0, 0)),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "Pod sandbox not ready, restartable init container failed, and RestartPolicy == "
    "OnFailure; create a new pod sandbox": (
        chain(policy("OnFailure"), sandbox_dead(), state(2, EXITED, 137)),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "Pod sandbox not ready, restartable init container failed, and RestartPolicy == Always; "
    "create a new pod sandbox": (
        chain(policy("Always"), sandbox_dead(), state(2, EXITED, 137)),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "initialization failed; restart the last restartable init container even if pod's "
    "RestartPolicy == Never": (
        chain(policy("Never"), state(2, EXITED, 137)), Expect(init=[2])),
    "restartable init container state unknown; kill and recreate the last restartable init "
    "container even if pod's RestartPolicy == Never": (
        chain(policy("Never"), state(2, UNKNOWN)),
        Expect(init=[2], kill={"initid3": "restartable-init-3"}),
    ),
    "restart restartable init container if regular containers are running even if pod's "
    "RestartPolicy == Never": (
        chain(policy("Never"), state(2, EXITED, 137), regular_instances(RUNNING)),
        Expect(init=[2]),
    ),
    "kill the pod if all main containers succeeded if pod's RestartPolicy == Never": (
        chain(policy("Never"), regular_instances(EXITED, 0)), Expect(kill_pod=True)),
    "some of the init container statuses are missing but the last init container is "
    "running, restart restartable init and regular containers": (
        chain(policy("Always"), keep_only(2)), Expect(init=[0, 1], start=[0, 1, 2])),
}


@pytest.mark.parametrize("mutate, want", SIDECAR_CASES.values(), ids=SIDECAR_CASES.keys())
def test_compute_pod_actions_with_restartable_init_containers(
    mutate: Callable[[Scenario], None], want: Expect
) -> None:
    run_table(base_with_sidecars, mutate, want)


# -- TestComputePodActionsWithInitAndEphemeralContainers ---------------------------------


def base_with_init_and_ephemeral() -> Scenario:
    pod = make_pod(init=[spec_container("init1", "bar-image")],
                   ephemeral=[spec_container("debug")])
    containers = [instance(pod, f"foo{i}", f"id{i}") for i in (1, 2, 3)]
    containers.append(instance(pod, "init1", "initid1", EXITED))
    containers.append(instance(pod, "debug", "debug1"))
    return Scenario(pod, runtime(containers))


def add_second_ephemeral(s: Scenario) -> None:
    spec = s.pod.spec
    ephemeral = [*spec.ephemeral_containers, Container(name="debug2", image="busybox")]
    s.pod = s.pod.model_copy(
        update={"spec": spec.model_copy(update={"ephemeral_containers": ephemeral})})


EPHEMERAL_CASES: dict[str, tuple[Callable[[Scenario], None], Expect]] = {
    "steady state; do nothing; ignore ephemeral container": (nothing, NO_ACTION),
    "No ephemeral containers running; start one": (keep_only(0, 4), Expect(ephemeral=[0])),
    "Start second ephemeral container": (add_second_ephemeral, Expect(ephemeral=[1])),
    "Ephemeral container exited; do not restart": (
        chain(policy("Always"), state(4, EXITED)), NO_ACTION),
    "initialization in progress; start ephemeral container": (
        chain(state(3, RUNNING), keep_only(0, 4)), Expect(ephemeral=[0])),
    "Create a new pod sandbox if the pod sandbox is dead, init container failed and "
    "RestartPolicy == OnFailure": (
        chain(policy("OnFailure"), sandbox_dead(), keep_only(3), exit_code(0, 137)),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "Kill pod and do not restart ephemeral container if the pod sandbox is dead": (
        chain(policy("Always"), sandbox_dead()),
        Expect(kill_pod=True, create_sandbox=True, attempt=1, init=[0]),
    ),
    "Kill pod if all containers exited except ephemeral container": (
        chain(policy("Never"), state(0, EXITED), state(1, EXITED), state(2, EXITED)),
        Expect(kill_pod=True),
    ),
    "Ephemeral container is in unknown state; leave it alone": (
        chain(policy("Never"), state(4, UNKNOWN)), NO_ACTION),
}


@pytest.mark.parametrize("mutate, want", EPHEMERAL_CASES.values(), ids=EPHEMERAL_CASES.keys())
def test_compute_pod_actions_with_init_and_ephemeral_containers(
    mutate: Callable[[Scenario], None], want: Expect
) -> None:
    run_table(base_with_init_and_ephemeral, mutate, want)


# -- kill reasons and messages -----------------------------------------------------------


def kills(actions: PodActions) -> Mapping[str, tuple[str, str]]:
    return {cid: (k.reason, k.message) for cid, k in actions.containers_to_kill.items()}


def test_definition_change_message_and_empty_reason() -> None:
    actions = run_table(base, lambda s: with_state(s, 1, RUNNING, spec_hash="stale"),
                        Expect(kill={"id2": "foo2"}, start=[1]))
    assert kills(actions) == {"id2": ("", "Container foo2 definition changed, will be restarted")}


def test_liveness_failure_reason() -> None:
    actions = run_table(base, lambda s: s.liveness.update(id2=FAILURE),
                        Expect(kill={"id2": "foo2"}, start=[1]))
    assert kills(actions) == {
        "id2": (REASON_LIVENESS_PROBE, "Container foo2 failed liveness probe, will be restarted")
    }


def test_liveness_failure_under_never_kills_without_restart() -> None:
    actions = run_table(base, chain(policy("Never"), lambda s: s.liveness.update(id2=FAILURE)),
                        Expect(kill={"id2": "foo2"}))
    assert kills(actions) == {
        "id2": (REASON_LIVENESS_PROBE, "Container foo2 failed liveness probe")
    }


def test_startup_failure_reason() -> None:
    actions = run_table(base, lambda s: s.startup.update(id3=FAILURE),
                        Expect(kill={"id3": "foo3"}, start=[2]))
    assert kills(actions)["id3"][0] == REASON_STARTUP_PROBE


def test_unknown_state_reason() -> None:
    actions = run_table(base, state(0, UNKNOWN), Expect(kill={"id1": "foo1"}, start=[0]))
    assert kills(actions)["id1"][0] == REASON_UNKNOWN


def test_reasons_explain_each_decision() -> None:
    actions = run_table(base, chain(policy("OnFailure"), state(0, EXITED, 1)),
                        Expect(start=[0]))
    assert actions.reasons == ["start foo1: exited 1, policy OnFailure"]
    assert compute_pod_actions(base().pod, base().status).reasons == []


# -- differences from Go, on purpose ------------------------------------------------------


def test_running_container_missing_from_spec_is_killed() -> None:
    def add_orphan(s: Scenario) -> None:
        orphan = RuntimeContainer(id="gone", name="removed", state=RUNNING)
        replace_containers(s, [*s.status.containers, orphan])
    actions = run_table(base, add_orphan, Expect(kill={"gone": "removed"}))
    assert kills(actions)["gone"] == ("", "Container removed is not in the pod spec")


def test_older_running_instance_is_killed() -> None:
    def add_duplicate(s: Scenario) -> None:
        old = instance(s.pod, "foo1", "old1")
        replace_containers(s, [*s.status.containers, old])
    run_table(base, add_duplicate, Expect(kill={"old1": "foo1"}))


def test_deleting_pod_is_killed_whole_and_nothing_restarts() -> None:
    def delete(s: Scenario) -> None:
        meta = s.pod.metadata.model_copy(update={"deletion_timestamp": "2026-11-22T10:00:00Z"})
        s.pod = s.pod.model_copy(update={"metadata": meta})
    run_table(base, delete, Expect(kill_pod=True))
    run_table(base, chain(delete, sandbox_dead()), Expect(kill_pod=True, attempt=1))
    run_table(base, chain(delete, state(0, EXITED, 1)), Expect(kill_pod=True))
    # Everything stopped: no new sandbox, no restart (the kill finds nothing to stop).
    run_table(base, chain(delete, all_exited(1), sandbox_dead()), Expect(kill_pod=True, attempt=1))


# -- PodSandboxChanged (kuberuntime/util TestPodSandboxChanged) ---------------------------


@pytest.mark.parametrize(
    "sandboxes, host_network, want",
    [
        pytest.param([], False, (True, 0, ""), id="Pod with no existing sandboxes"),
        pytest.param([sandbox(attempt=1, sandbox_id="s2"), sandbox(sandbox_id="s1")], False,
                     (True, 2, "s2"), id="Pod with multiple ready sandbox statuses"),
        pytest.param([sandbox(SandboxState.NOTREADY, 1, sandbox_id="s2"),
                      sandbox(SandboxState.NOTREADY, 0, sandbox_id="s1")], False,
                     (True, 2, "s2"), id="Pod with no ready sandbox statuses"),
        pytest.param([sandbox(sandbox_id="s1")], True, (True, 1, ""),
                     id="Pod with ready sandbox status but network namespace mismatch"),
        pytest.param([sandbox(ip="", sandbox_id="s1")], False, (True, 1, "s1"),
                     id="Pod with ready sandbox status but no IP"),
        pytest.param([sandbox(sandbox_id="s1")], False, (False, 0, "s1"),
                     id="Pod with ready sandbox status with IP"),
        pytest.param([sandbox(sandbox_id="s1"), sandbox(SandboxState.NOTREADY, 1, sandbox_id="s2")],
                     False, (False, 1, "s1"),
                     id="Pod with multiple sandboxes but ready one is not latest"),
        pytest.param([sandbox(ip="", sandbox_id="s1", host_network=True)], True,
                     (False, 0, "s1"), id="host network pod needs no IP"),
    ],
)
def test_pod_sandbox_changed(
    sandboxes: list[RuntimeSandbox], host_network: bool, want: tuple[bool, int, str]
) -> None:
    pod = make_pod(hostNetwork=host_network)
    change = pod_sandbox_changed(pod, runtime([], sandboxes))
    assert (change.create, change.attempt, change.sandbox_id) == want
    assert bool(change.reason) == change.create


# -- ShouldContainerBeRestarted ------------------------------------------------------------


@pytest.mark.parametrize(
    "pod_policy, state_, code, want",
    [
        ("Never", None, 0, True),
        ("Never", RUNNING, 0, False),
        ("Never", CREATED, 0, True),
        ("Never", UNKNOWN, 0, True),
        ("Never", EXITED, 1, False),
        ("OnFailure", EXITED, 0, False),
        ("OnFailure", EXITED, 2, True),
        ("Always", EXITED, 0, True),
    ],
)
def test_should_container_be_restarted(
    pod_policy: str, state_: ContainerState | None, code: int, want: bool
) -> None:
    pod = make_pod(policy=pod_policy)
    containers = [] if state_ is None else [instance(pod, "foo1", "id1", state_, code)]
    assert should_container_be_restarted(pod.spec.containers[0], pod, runtime(containers)) is want


def test_sidecar_restarts_on_exit_even_under_never() -> None:
    pod = make_pod(init=[sidecar("side")], policy="Never")
    status = runtime([instance(pod, "side", "s", EXITED, 0)])
    assert should_container_be_restarted(pod.spec.init_containers[0], pod, status)


def test_no_container_restarts_while_pod_is_deleted() -> None:
    pod = make_pod()
    pod.metadata.deletion_timestamp = "2026-11-22T10:00:00Z"
    assert not should_container_be_restarted(pod.spec.containers[0], pod, runtime([]))

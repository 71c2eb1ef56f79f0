"""Hypothesis strategies: pod specs, and runtime states and probe results consistent with a pod."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from trio_kubelet.core.hashing import container_hash
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)
from trio_kubelet.model.pod import Container, Pod, is_sidecar

RESTART_POLICIES = ("Always", "OnFailure", "Never")
IMAGES = ("busybox:1.36", "nginx:1.27", "registry.local/app:v2")
PROBE = {"exec": {"command": ["true"]}}
EXIT_CODES = (0, 1, 137)
STALE_HASH = "0000000000000000"

# -- pod specs ---------------------------------------------------------------------------


@st.composite
def container_specs(draw: st.DrawFn, name: str, *, may_be_sidecar: bool = False,
                    probes: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "image": draw(st.sampled_from(IMAGES))}
    if may_be_sidecar and draw(st.booleans()):
        spec["restartPolicy"] = "Always"
    if probes:
        for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
            if draw(st.integers(0, 3)) == 0:
                spec[probe] = PROBE
    return spec


@st.composite
def pods(
    draw: st.DrawFn,
    *,
    policies: Sequence[str] = RESTART_POLICIES,
    max_containers: int = 3,
    max_init: int = 3,
    max_ephemeral: int = 1,
    sidecars: bool = True,
    deleting: bool | None = False,
) -> Pod:
    """A valid pod: 1..3 regular containers, init containers (some sidecars), ephemeral ones."""
    regular = draw(st.integers(1, max_containers))
    init = draw(st.integers(0, max_init))
    ephemeral = draw(st.integers(0, max_ephemeral))
    is_deleting = draw(st.booleans()) if deleting is None else deleting
    metadata: dict[str, Any] = {"name": "web", "namespace": "default", "uid": "uid-1"}
    if is_deleting:
        metadata["deletionTimestamp"] = "2026-11-22T10:00:00Z"
    return Pod.model_validate({
        "metadata": metadata,
        "spec": {
            "restartPolicy": draw(st.sampled_from(policies)),
            "hostNetwork": draw(st.integers(0, 4)) == 0,
            "containers": [draw(container_specs(f"app{i}")) for i in range(regular)],
            "initContainers": [draw(container_specs(f"init{i}", may_be_sidecar=sidecars))
                               for i in range(init)],
            "ephemeralContainers": [draw(container_specs(f"debug{i}", probes=False))
                                    for i in range(ephemeral)],
        },
    })


def all_containers(pod: Pod) -> list[Container]:
    spec = pod.spec
    return [*spec.init_containers, *spec.containers, *spec.ephemeral_containers]


def regular_init_containers(pod: Pod) -> list[Container]:
    return [c for c in pod.spec.init_containers if not is_sidecar(c)]


# -- runtime states ----------------------------------------------------------------------


@st.composite
def sandboxes_for(draw: st.DrawFn, pod: Pod, *, at_least_one: bool) -> tuple[RuntimeSandbox, ...]:
    count = draw(st.integers(1 if at_least_one else 0, 2))
    result = []
    for position in range(count):
        host_network = pod.spec.host_network
        if draw(st.integers(0, 9)) == 0:
            host_network = not host_network
        ready = draw(st.booleans()) if position == 0 else draw(st.integers(0, 4)) == 0
        result.append(RuntimeSandbox(
            id=f"sandbox{count - position}",
            state=SandboxState.READY if ready else SandboxState.NOTREADY,
            attempt=count - position - 1,
            created_at=float(count - position),
            host_network=host_network,
            ip="" if host_network or draw(st.integers(0, 9)) == 0 else f"10.0.0.{position + 2}",
        ))
    return tuple(result)


@st.composite
def instance_histories(
    draw: st.DrawFn, container: Container, *, must_have_succeeded: bool = False
) -> list[tuple[ContainerState, int, bool]]:
    """(state, exit code, hash is current) per instance, oldest first."""
    if must_have_succeeded:
        return [(ContainerState.EXITED, 0, True)]
    count = draw(st.integers(0, 2))
    history = [(ContainerState.EXITED, draw(st.sampled_from(EXIT_CODES)), True)
               for _ in range(max(count - 1, 0))]
    if count:
        newest = draw(st.sampled_from(list(ContainerState)))
        code = draw(st.sampled_from(EXIT_CODES)) if newest is ContainerState.EXITED else 0
        history.append((newest, code, draw(st.integers(0, 5)) != 0))
    return history


@st.composite
def runtime_statuses(draw: st.DrawFn, pod: Pod, *, orphans: bool = True) -> RuntimePodStatus:
    """A runtime state the agent could plausibly observe for ``pod``.

    Containers only exist beside a sandbox, and regular containers only after every
    regular init container succeeded (the kubelet keeps the newest init instance).
    """
    spec = pod.spec
    plans: dict[str, list[tuple[ContainerState, int, bool]]] = {}
    for container in [*spec.containers, *spec.init_containers, *spec.ephemeral_containers]:
        plans[container.name] = draw(instance_histories(container))
    # An init container (or any regular container) only ever ran after every regular
    # init container before it succeeded, and the newest init instances are kept.
    reached = len(spec.init_containers) if any(plans[c.name] for c in spec.containers) else max(
        (i for i, c in enumerate(spec.init_containers) if plans[c.name]), default=-1)
    for container in spec.init_containers[:max(reached, 0)]:
        if not is_sidecar(container) and plans[container.name][-1:] != [
                (ContainerState.EXITED, 0, True)]:
            plans[container.name] = draw(instance_histories(container, must_have_succeeded=True))
    specs = {c.name: c for c in all_containers(pod)}
    if orphans and draw(st.integers(0, 9)) == 0:
        plans["removed"] = [(draw(st.sampled_from([ContainerState.RUNNING,
                                                   ContainerState.EXITED])), 0, False)]
    has_containers = any(plans.values())
    sandboxes = draw(sandboxes_for(pod, at_least_one=has_containers))
    order = draw(st.permutations(sorted(plans)))
    containers = _materialise(plans, specs, order, sandboxes)
    return RuntimePodStatus(uid="uid-1", name="web", namespace="default",
                            sandboxes=sandboxes, containers=containers)


def _materialise(
    plans: dict[str, list[tuple[ContainerState, int, bool]]],
    specs: dict[str, Container],
    order: Sequence[str],
    sandboxes: Sequence[RuntimeSandbox],
) -> tuple[RuntimeContainer, ...]:
    """Instances with increasing creation times per name, returned newest first."""
    made: list[RuntimeContainer] = []
    clock = 10.0
    sandbox_id = sandboxes[0].id if sandboxes else ""
    for name in order:
        for restart, (state, code, current) in enumerate(plans[name]):
            clock += 1.0
            spec = specs.get(name)
            made.append(RuntimeContainer(
                id=f"{name}-{restart}",
                name=name,
                state=state,
                spec_hash=container_hash(spec) if spec is not None and current else STALE_HASH,
                restart_count=restart,
                exit_code=code,
                reason=("Completed" if code == 0 else "Error")
                if state is ContainerState.EXITED else "",
                created_at=clock,
                started_at=clock,
                finished_at=clock + 0.5 if state is ContainerState.EXITED else 0.0,
                image=spec.image if spec is not None else "busybox",
                sandbox_id=sandbox_id,
            ))
    made.sort(key=lambda c: c.created_at, reverse=True)
    return tuple(made)


@st.composite
def probe_results(draw: st.DrawFn, status: RuntimePodStatus) -> dict[str, ProbeResult]:
    """Published results for some of the live instances (missing = not reported yet)."""
    results: dict[str, ProbeResult] = {}
    for instance in status.containers:
        if instance.state is ContainerState.RUNNING:
            choice = draw(st.sampled_from([None, *ProbeResult]))
            if choice is not None:
                results[instance.id] = choice
    return results


@st.composite
def pods_with_state(
    draw: st.DrawFn, /, **pod_options: Any
) -> tuple[Pod, RuntimePodStatus, dict[str, ProbeResult], dict[str, ProbeResult]]:
    pod = draw(pods(**pod_options))
    status = draw(runtime_statuses(pod))
    return pod, status, draw(probe_results(status)), draw(probe_results(status))

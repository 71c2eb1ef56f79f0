"""A tiny pure runtime: applies PodActions to a RuntimePodStatus the way SyncPod would.

It stands in for the CRI in property tests. Kills turn live instances into exited
ones; a new sandbox makes the old ones not ready (and, as SyncPod does, purges the
old init containers); starts add a new running instance with restart_count + 1.
``settle`` then plays the world: regular init containers run to completion.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from trio_kubelet.core.actions import PodActions, compute_pod_actions
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

LIVE = (ContainerState.RUNNING, ContainerState.UNKNOWN, ContainerState.CREATED)


@dataclass
class Simulator:
    """One pod on a fake runtime, with a logical clock for IDs and creation times."""

    pod: Pod
    status: RuntimePodStatus
    clock: float = 1000.0

    def tick(self) -> float:
        self.clock += 1.0
        return self.clock

    def healthy_probes(self) -> dict[str, ProbeResult]:
        """Every running instance passes its probes."""
        return {c.id: ProbeResult.SUCCESS for c in self.status.containers
                if c.state is ContainerState.RUNNING}

    def sync(self) -> PodActions:
        """Compute actions with healthy probes, apply them, then let init containers finish."""
        probes = self.healthy_probes()
        actions = compute_pod_actions(self.pod, self.status, liveness=probes, startup=probes)
        self.apply(actions)
        self.settle()
        return actions

    def apply(self, actions: PodActions) -> None:
        status = self.status
        if actions.kill_pod:
            status = self._kill(status, (c.id for c in status.containers))
            status = replace(status, sandboxes=tuple(_not_ready(s) for s in status.sandboxes))
            if actions.create_sandbox:
                init_names = {c.name for c in self.pod.spec.init_containers}
                status = replace(status, containers=tuple(
                    c for c in status.containers if c.name not in init_names))
        else:
            status = self._kill(status, actions.containers_to_kill)
        if actions.create_sandbox:
            status = self._create_sandbox(status, actions.attempt)
        self.status = status
        if status.sandboxes and status.sandboxes[0].state is SandboxState.READY:
            spec = self.pod.spec
            self._start(spec.ephemeral_containers, actions.ephemeral_containers_to_start)
            self._start(spec.init_containers, actions.init_containers_to_start)
            self._start(spec.containers, actions.containers_to_start)

    def settle(self) -> None:
        """Running regular init containers complete successfully."""
        regular_init = {c.name for c in self.pod.spec.init_containers if not is_sidecar(c)}
        self.status = replace(self.status, containers=tuple(
            _exited(c, 0, self.tick())
            if c.name in regular_init and c.state is ContainerState.RUNNING else c
            for c in self.status.containers))

    def exit(self, name: str, code: int) -> None:
        """The newest instance of ``name`` exits (the world, not the kubelet, did it)."""
        newest = self.status.find(name)
        assert newest is not None
        self.status = self._kill(self.status, [newest.id], code)

    def _kill(self, status: RuntimePodStatus, ids: Iterable[str], code: int = 137
              ) -> RuntimePodStatus:
        doomed = set(ids)
        now = self.tick()
        return replace(status, containers=tuple(
            _exited(c, code, now) if c.id in doomed and c.state in LIVE else c
            for c in status.containers))

    def _create_sandbox(self, status: RuntimePodStatus, attempt: int) -> RuntimePodStatus:
        host_network = self.pod.spec.host_network
        sandbox = RuntimeSandbox(
            id=f"sandbox-{int(self.tick())}",
            state=SandboxState.READY,
            attempt=attempt,
            created_at=self.clock,
            host_network=host_network,
            ip="" if host_network else f"10.1.0.{attempt % 250 + 2}",
        )
        old = tuple(_not_ready(s) for s in status.sandboxes)
        return replace(status, sandboxes=(sandbox, *old))

    def _start(self, containers: list[Container], indexes: list[int]) -> None:
        for index in indexes:
            container = containers[index]
            previous = self.status.find(container.name)
            now = self.tick()
            instance = RuntimeContainer(
                id=f"{container.name}-{int(now)}",
                name=container.name,
                state=ContainerState.RUNNING,
                spec_hash=container_hash(container),
                restart_count=previous.restart_count + 1 if previous is not None else 0,
                created_at=now,
                started_at=now,
                image=container.image,
                sandbox_id=self.status.sandboxes[0].id,
            )
            self.status = replace(self.status, containers=(instance, *self.status.containers))


def _not_ready(sandbox: RuntimeSandbox) -> RuntimeSandbox:
    return replace(sandbox, state=SandboxState.NOTREADY)


def _exited(container: RuntimeContainer, code: int, now: float) -> RuntimeContainer:
    return replace(container, state=ContainerState.EXITED, exit_code=code, finished_at=now,
                   reason="Completed" if code == 0 else "Error")


def is_noop(actions: PodActions) -> bool:
    """Nothing to create, start or kill."""
    return not (actions.kill_pod or actions.create_sandbox or actions.containers_to_kill
                or actions.init_containers_to_start or actions.containers_to_start
                or actions.ephemeral_containers_to_start)

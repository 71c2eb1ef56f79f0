"""JSON forms of the pure core's inputs and outputs, so decisions can be written and re-checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trio_kubelet.core.actions import PodActions
from trio_kubelet.core.observed import (
    ContainerState,
    ProbeResult,
    RuntimeContainer,
    RuntimePodStatus,
    RuntimeSandbox,
    SandboxState,
)

_CONTAINER_FIELDS = RuntimeContainer.__dataclass_fields__.keys()
_SANDBOX_FIELDS = RuntimeSandbox.__dataclass_fields__.keys()


def _container_json(container: RuntimeContainer) -> dict[str, Any]:
    data = {name: getattr(container, name) for name in _CONTAINER_FIELDS}
    data["state"] = container.state.value
    return data


def _sandbox_json(sandbox: RuntimeSandbox) -> dict[str, Any]:
    data = {name: getattr(sandbox, name) for name in _SANDBOX_FIELDS}
    data["state"] = sandbox.state.value
    data["additional_ips"] = list(sandbox.additional_ips)
    return data


def observed_to_json(status: RuntimePodStatus) -> dict[str, Any]:
    return {
        "uid": status.uid,
        "name": status.name,
        "namespace": status.namespace,
        "sandboxes": [_sandbox_json(s) for s in status.sandboxes],
        "containers": [_container_json(c) for c in status.containers],
    }


def observed_from_json(data: dict[str, Any]) -> RuntimePodStatus:
    """Rebuild a RuntimePodStatus; raises KeyError/ValueError/TypeError on a malformed one."""
    sandboxes = tuple(
        RuntimeSandbox(
            **{**s, "state": SandboxState(s["state"]), "additional_ips": tuple(s["additional_ips"])}
        )
        for s in data["sandboxes"]
    )
    containers = tuple(
        RuntimeContainer(**{**c, "state": ContainerState(c["state"])}) for c in data["containers"]
    )
    return RuntimePodStatus(
        uid=data["uid"],
        name=data["name"],
        namespace=data["namespace"],
        sandboxes=sandboxes,
        containers=containers,
    )


def actions_to_json(actions: PodActions) -> dict[str, Any]:
    return {
        "kill_pod": actions.kill_pod,
        "create_sandbox": actions.create_sandbox,
        "sandbox_id": actions.sandbox_id,
        "attempt": actions.attempt,
        "init_containers_to_start": list(actions.init_containers_to_start),
        "containers_to_start": list(actions.containers_to_start),
        "containers_to_kill": {
            cid: {"name": k.name, "reason": k.reason, "message": k.message}
            for cid, k in actions.containers_to_kill.items()
        },
        "ephemeral_containers_to_start": list(actions.ephemeral_containers_to_start),
        "reasons": list(actions.reasons),
    }


def probe_results_to_json(results: Mapping[str, ProbeResult]) -> dict[str, str]:
    return {cid: result.value for cid, result in results.items()}


def probe_results_from_json(data: dict[str, str]) -> dict[str, ProbeResult]:
    return {cid: ProbeResult(value) for cid, value in data.items()}

#!/usr/bin/env python3
"""Stop and remove every pod sandbox and container a CRI runtime knows about.

Usage: cri_reset.py SOCKET

Goes through CRI (not ctr) so the runtime tears pods down properly: CNI DEL releases the pod IP,
veth and hostPort rules. Used by `scripts/containerd-env stop` and by the integration tests'
per-test cleanup. Needs grpcio and cri_api (PyPI: container-runtime-interface-api).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1.api_pb2_grpc import RuntimeServiceStub


@dataclass
class ResetResult:
    sandboxes: int = 0
    containers: int = 0


def _ignore_not_found(call: object, request: object, timeout: float) -> None:
    try:
        call(request, timeout=timeout)  # type: ignore[operator]
    except grpc.RpcError as err:
        # A pod removed concurrently (or by an earlier step) is what we want anyway.
        if err.code() != grpc.StatusCode.NOT_FOUND:
            raise


def reset(runtime: RuntimeServiceStub, timeout: float = 30.0, attempts: int = 5) -> ResetResult:
    """Remove everything, retrying a few times.

    containerd answers UNKNOWN ("ttrpc: closed") when asked to stop a container
    whose process is exiting at that very moment; a second pass succeeds.
    """
    for attempt in range(attempts):
        try:
            return _reset_once(runtime, timeout)
        except grpc.RpcError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _reset_once(runtime: RuntimeServiceStub, timeout: float) -> ResetResult:
    """Remove all sandboxes (and with them their containers), then any stray container."""
    result = ResetResult()
    for sandbox in runtime.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=timeout).items:
        _ignore_not_found(
            runtime.StopPodSandbox, cri.StopPodSandboxRequest(pod_sandbox_id=sandbox.id), timeout
        )
        _ignore_not_found(
            runtime.RemovePodSandbox,
            cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id),
            timeout,
        )
        result.sandboxes += 1
    containers = runtime.ListContainers(cri.ListContainersRequest(), timeout=timeout).containers
    for container in containers:
        _ignore_not_found(
            runtime.StopContainer, cri.StopContainerRequest(container_id=container.id), timeout
        )
        _ignore_not_found(
            runtime.RemoveContainer, cri.RemoveContainerRequest(container_id=container.id), timeout
        )
        result.containers += 1
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with grpc.insecure_channel(f"unix://{argv[1]}") as channel:
            result = reset(RuntimeServiceStub(channel))
    except grpc.RpcError as err:
        print(f"cri_reset: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    if result.sandboxes or result.containers:
        print(
            f"cri_reset: removed {result.sandboxes} sandbox(es), "
            f"{result.containers} stray container(s)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

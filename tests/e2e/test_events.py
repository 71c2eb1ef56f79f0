"""Events reach the real kube-apiserver as the node's identity: created once, then updated with
the count when the same event happens again."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
import trio

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import load_kubeconfig
from trio_kubelet.kube_events import EventRecorder

if TYPE_CHECKING:
    from tests.e2e.conftest import ControlPlane

pytestmark = pytest.mark.e2e


def node_events(control_plane: ControlPlane, reason: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=Node,involvedObject.name={control_plane.node},reason={reason}"
    with control_plane.admin() as admin:
        response = admin.get("/api/v1/namespaces/default/events",
                             params={"fieldSelector": selector})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_a_repeated_node_event_is_one_event_with_count_2(
    control_plane: ControlPlane,
) -> None:
    reason = f"E2ETest{time.time_ns()}"  # unique, as a reused control plane keeps old events
    client = APIClient(load_kubeconfig(control_plane.node_kubeconfig()))
    recorder = EventRecorder(control_plane.node, client)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(recorder.run)
            for _ in range(2):
                recorder.node_event(control_plane.node, "Warning", reason, "it happened")
            with trio.fail_after(30):
                while not any(e["count"] == 2 for e in await trio.to_thread.run_sync(
                        node_events, control_plane, reason)):
                    await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    finally:
        await client.aclose()

    [event] = node_events(control_plane, reason)
    assert event["count"] == 2
    assert event["type"] == "Warning"
    assert event["message"] == "it happened"
    assert event["source"] == {"component": "kubelet", "host": control_plane.node}
    assert event["involvedObject"] == {"kind": "Node", "name": control_plane.node,
                                       "uid": control_plane.node}
    assert event["reportingComponent"] == "kubelet"
    assert event["reportingInstance"] == control_plane.node
    assert event["metadata"]["name"].startswith(f"{control_plane.node}.")
    assert event["lastTimestamp"] >= event["firstTimestamp"]

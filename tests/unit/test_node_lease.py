"""node/lease.py: the Lease object the node heartbeats with."""

from __future__ import annotations

import trio
import trio.testing

from trio_kubelet.apiserver.errors import APIError
from trio_kubelet.node.lease import LeaseController, format_micro_time, lease_object

T0 = 1_700_000_000.25


def test_a_new_lease_names_its_holder_duration_and_owner() -> None:
    assert lease_object("node-a", duration_seconds=40, renew_time=T0, node_uid="uid-1") == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "node-a",
            "namespace": "kube-node-lease",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1"}
            ],
        },
        "spec": {
            "holderIdentity": "node-a",
            "leaseDurationSeconds": 40,
            "renewTime": "2023-11-14T22:13:20.250000Z",
        },
    }


def test_a_renewal_only_moves_renew_time_and_adds_a_missing_owner() -> None:
    base = {
        "metadata": {"name": "node-a", "namespace": "kube-node-lease", "resourceVersion": "7"},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40, "renewTime": "old"},
    }
    renewed = lease_object(
        "node-a", duration_seconds=10, renew_time=T0 + 10, node_uid=None, base=base
    )
    assert renewed["metadata"] == base["metadata"]  # resourceVersion kept: optimistic update
    assert renewed["spec"] == {**base["spec"], "renewTime": "2023-11-14T22:13:30.250000Z"}
    assert base["spec"]["renewTime"] == "old"  # the base is not modified
    owned = lease_object("node-a", duration_seconds=40, renew_time=T0, node_uid="u", base=base)
    assert owned["metadata"]["ownerReferences"][0]["uid"] == "u"
    again = lease_object("node-a", duration_seconds=40, renew_time=T0, node_uid="v", base=owned)
    assert again["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_micro_time() -> None:
    assert format_micro_time(T0 + 0.000001) == "2023-11-14T22:13:20.250001Z"


class Unreachable:
    """An API server that answers the Lease GET only after ``failures`` attempts; the times
    (trio's clock) of the attempts."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts: list[float] = []

    async def get(self, path: str) -> dict[str, object]:
        self.attempts.append(trio.current_time())
        if len(self.attempts) <= self.failures:
            raise APIError(0, "", "connection refused")
        return {"metadata": {"name": "node-a"}, "spec": {}}


async def test_ensuring_the_lease_backs_off_from_200_ms_doubling_up_to_7_s(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After an API server outage the Lease is retried within 7 s: the ceiling that bounds
    how long a node's heartbeat stays away once the API server is back."""
    server = Unreachable(failures=9)
    controller = LeaseController(server, "node-a", duration_seconds=40,  # type: ignore[arg-type]
                                 wall_clock=lambda: T0, node_uid=lambda: "uid-1")
    lease, created = await controller._backoff_ensure()
    assert lease is not None and not created
    waits = [round(b - a, 3) for a, b in zip(server.attempts, server.attempts[1:], strict=False)]
    assert waits == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 7.0, 7.0, 7.0]

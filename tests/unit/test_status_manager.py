"""Pure parts of the API side: merge patches, the status to send, the pod the reconciler sees."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import Connection
from trio_kubelet.model.pod import PodStatus
from trio_kubelet.sources.apiserver import APIPods, pod_to_run
from trio_kubelet.status.manager import StatusManager, desired_status, status_patch
from trio_kubelet.status.merge_patch import merge_patch
from trio_kubelet.status.mirror import mirror_is_current, mirror_pod
from trio_kubelet.status.store import PodStatusStore


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386's reference algorithm, to check the patches against."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


json_values = st.recursive(
    st.integers() | st.text(max_size=3) | st.booleans(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=10,
)
json_objects = st.dictionaries(st.text(max_size=3), json_values, max_size=4)


@given(json_objects, json_objects)
def test_merge_patch_turns_old_into_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    patch = merge_patch(old, new)
    assert apply_merge_patch(old, patch) == new
    assert (patch == {}) == (old == new)


def test_status_merge_keeps_foreign_conditions_and_fields() -> None:
    api = {
        "phase": "Pending",
        "message": "old",
        "nominatedNodeName": "n",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "example.com/gate", "status": "False"},
        ],
    }
    ours = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True"},
        ],
    }
    wanted = desired_status(api, ours)
    assert wanted == {
        "phase": "Running",
        "nominatedNodeName": "n",
        "conditions": [  # the API's order, ours that it lacks last
            {"type": "PodScheduled", "status": "True"},
            {"type": "example.com/gate", "status": "False"},
            {"type": "Ready", "status": "True"},
        ],
    }
    assert merge_patch(api, wanted)["message"] is None  # a stale message is cleared


def test_a_readiness_gate_condition_stays_as_the_api_has_it() -> None:
    """Ours shows the gate as the worker last saw it; the API's newer copy is kept."""
    api = {"conditions": [{"type": "example.com/gate", "status": "True"}]}
    ours = {"conditions": [{"type": "example.com/gate", "status": "False"},
                           {"type": "Ready", "status": "False"},
                           {"type": "DisruptionTarget", "status": "True"}]}
    wanted = desired_status(api, ours)
    assert wanted is not None and wanted["conditions"] == [
        {"type": "example.com/gate", "status": "True"},
        {"type": "Ready", "status": "False"},
        {"type": "DisruptionTarget", "status": "True"},  # shared: an eviction sets it
    ]


def test_the_status_patch_sends_only_the_changed_conditions_merged_by_type() -> None:
    """A strategic merge: a condition set by someone else after ``old`` was read survives,
    a changed condition loses the fields it no longer has, IP lists are replaced whole."""
    old = {
        "phase": "Pending",
        "podIPs": [{"ip": "10.0.0.5"}],
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "m"},
            {"type": "example.com/gate", "status": "True"},
        ],
    }
    new = {
        "phase": "Running",
        "podIPs": [{"ip": "10.0.0.6"}],
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True"},
            {"type": "example.com/gate", "status": "True"},
            {"type": "Initialized", "status": "True"},
        ],
    }
    assert status_patch(old, new) == {
        "phase": "Running",
        "podIPs": [{"$patch": "replace"}, {"ip": "10.0.0.6"}],
        "conditions": [
            {"type": "Ready", "status": "True", "reason": None, "message": None},
            {"type": "Initialized", "status": "True"},
        ],
    }
    reordered = {**old, "conditions": old["conditions"][::-1]}
    assert status_patch(old, reordered) == {}  # the server keeps its order


def test_terminal_phase_in_the_api_never_regresses() -> None:
    assert desired_status({"phase": "Succeeded"}, {"phase": "Running"}) is None
    assert desired_status({"phase": "Failed"}, {"phase": "Failed", "reason": "x"}) is not None


def api_pod(name: str = "web", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "resourceVersion": "7",
            "managedFields": [{"manager": "kubectl"}],
            **meta,
        },
        "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Pending"},
    }


def test_status_only_changes_do_not_change_the_pod_to_run() -> None:
    first = api_pod()
    second = {**api_pod(), "status": {"phase": "Running"}}
    second["metadata"]["resourceVersion"] = "8"
    assert pod_to_run(first) == pod_to_run(second)
    assert pod_to_run(first).metadata.annotations["kubernetes.io/config.source"] == "api"


def test_the_pod_to_run_carries_its_readiness_gates_conditions_only() -> None:
    """A gate's condition decides Ready, so its change is a change of the pod to run."""
    def gated(gate_status: str) -> dict[str, Any]:
        pod = api_pod()
        pod["spec"]["readinessGates"] = [{"conditionType": "example.com/gate"}]
        pod["status"] = {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "example.com/gate", "status": gate_status},
        ]}
        return pod

    run = pod_to_run(gated("False"))
    assert [(c.type, c.status) for c in run.status.conditions] == [("example.com/gate", "False")]
    assert run.status.phase == "Pending"  # nothing else of the status
    assert pod_to_run(gated("True")) != run
    ours_changed = gated("False")
    ours_changed["status"]["conditions"][0]["status"] = "False"
    assert pod_to_run(ours_changed) == run


def test_api_pods_set_aside_mirrors_and_reject_invalid_pods() -> None:
    pods = APIPods()
    pods.take(api_pod("web"))
    pods.take(api_pod("static-n", annotations={"kubernetes.io/config.mirror": "h"}))
    bad = api_pod("bad")
    bad["spec"]["containers"][0]["resources"] = {"limits": {"memory": "lots"}}
    pods.take(bad)
    update = pods.update()
    assert [p.metadata.name for p in update.pods] == ["web"]
    assert list(pods.mirrors) == ["default/static-n"]
    assert "memory" in pods.rejected["uid-bad"].reason
    assert [p.file for p in update.problems] == ["default/bad"]
    pods.forget(api_pod("static-n"))
    pods.forget(api_pod("static-n", uid="uid-static-n"))
    assert pods.mirrors == {}


def test_mirror_pod_names_its_node_and_its_static_pods_hash() -> None:
    static = pod_to_run(api_pod("etcd-n", annotations={"kubernetes.io/config.hash": "abc"}))
    mirror = mirror_pod(static, "n", "node-uid")
    assert mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"] == "abc"
    assert mirror["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "node-uid", "controller": True}
    ]
    assert "uid" not in mirror["metadata"] and "status" not in mirror
    assert mirror_is_current(mirror, static)
    edited = static.model_copy(
        update={
            "metadata": static.metadata.model_copy(
                update={"annotations": {"kubernetes.io/config.hash": "def"}}
            )
        }
    )
    assert not mirror_is_current(mirror, edited)


# -- the manager against a fake transport ---------------------------------------------------


class FakeAPI:
    """Records what the status manager sends; answers like the API server would."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))
        if request.method == "PATCH":
            return httpx.Response(200, json={"status": {}})
        return httpx.Response(200, json={"kind": "Status", "status": "Success"})


def manager_for(fake: FakeAPI, store: PodStatusStore, pods: APIPods) -> StatusManager:
    connection = Connection(server="http://api.test", ssl_context=None)
    client = APIClient(connection, transport=httpx.MockTransport(fake))
    return StatusManager(client, store, pods, wall_time=lambda: "2026-11-22T10:00:00Z")


async def test_a_pod_the_agent_cannot_run_is_reported_failed_with_the_reason() -> None:
    pods, store, fake = APIPods(), PodStatusStore(), FakeAPI()
    bad = api_pod("bad")
    bad["spec"]["containers"][0]["resources"] = {"limits": {"memory": "lots"}}
    pods.take(bad)
    pods.synced = True
    await manager_for(fake, store, pods).sync_all()
    ((method, path, body),) = fake.requests
    assert (method, path) == ("PATCH", "/api/v1/namespaces/default/pods/bad/status")
    assert body["metadata"] == {"uid": "uid-bad"}
    assert body["status"]["phase"] == "Failed"
    assert body["status"]["reason"] == "UnsupportedPodSpec"
    assert "memory" in body["status"]["message"]


async def test_status_is_sent_once_and_a_stopped_deleted_pod_is_deleted_with_grace_0() -> None:
    pods, store, fake = APIPods(), PodStatusStore(), FakeAPI()
    pods.take(api_pod("web"))
    pods.synced = True
    pod = pods.pods["uid-web"]
    store.set(pod, PodStatus(phase="Running"))
    manager = manager_for(fake, store, pods)
    await manager.sync_all()
    await manager.sync_all()  # nothing changed: nothing sent
    assert [(m, p) for m, p, _ in fake.requests] == [
        ("PATCH", "/api/v1/namespaces/default/pods/web/status")]
    assert fake.requests[0][2]["status"]["phase"] == "Running"

    deleting = api_pod("web", deletionTimestamp="2026-11-22T10:00:00Z")
    pods.take(deleting)
    store.set(pods.pods["uid-web"], PodStatus(phase="Running"), stopped=False)
    await manager.sync_all()
    assert all(m != "DELETE" for m, _, _ in fake.requests), "still running: not yet"
    store.set(pods.pods["uid-web"], PodStatus(phase="Failed"), stopped=True)
    await manager.sync_all()
    method, path, body = fake.requests[-1]
    assert (method, path) == ("DELETE", "/api/v1/namespaces/default/pods/web")
    assert body["gracePeriodSeconds"] == 0 and body["preconditions"] == {"uid": "uid-web"}


class RecordingCache:
    def __init__(self) -> None:
        self.registered: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def register_pod(self, pod: Any) -> None:
        self.registered.add(pod.metadata.uid)
        self.calls.append(("register", pod.metadata.uid))

    def unregister_pod(self, uid: str) -> None:
        self.registered.discard(uid)
        self.calls.append(("unregister", uid))


def test_a_new_version_of_a_pod_is_registered_again_without_unregistering_it() -> None:
    """Unregistering first would restart the watches of its objects at every status update
    (its own, echoed by the watch), leaving them unlisted for a moment each time."""
    cache = RecordingCache()
    pods = APIPods(caches=[cache])  # type: ignore[list-item]
    pods.take(api_pod("web"))
    pods.take({**api_pod("web"), "status": {"phase": "Running"}})
    assert cache.calls == [("register", "uid-web"), ("register", "uid-web")]
    bad = api_pod("web")
    bad["spec"]["containers"][0]["resources"] = {"limits": {"memory": "lots"}}
    pods.take(bad)  # now rejected: its objects are no longer the node's to read
    assert cache.calls[-1] == ("unregister", "uid-web") and "uid-web" in pods.rejected
    pods.take(api_pod("web"))
    assert cache.calls[-1] == ("register", "uid-web") and pods.rejected == {}


def test_pods_to_run_are_registered_with_the_object_caches_and_only_they() -> None:
    cache = RecordingCache()
    pods = APIPods(caches=[cache])  # type: ignore[list-item]
    pods.take(api_pod("web"))
    pods.take(api_pod("static-n", annotations={"kubernetes.io/config.mirror": "h"}))
    assert cache.registered == {"uid-web"}
    pods.forget(api_pod("web"))
    assert cache.registered == set()


async def test_a_forbidden_status_update_is_not_retried_until_the_status_changes() -> None:
    pods, store = APIPods(), PodStatusStore()
    seen: list[str] = []

    def forbid(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        return httpx.Response(403, json={"kind": "Status", "reason": "Forbidden",
                                         "message": "node may not"})

    connection = Connection(server="http://api.test", ssl_context=None)
    client = APIClient(connection, transport=httpx.MockTransport(forbid))
    manager = StatusManager(client, store, pods, wall_time=lambda: "2026-11-22T10:00:00Z")
    pods.take(api_pod("web"))
    pods.synced = True
    store.set(pods.pods["uid-web"], PodStatus(phase="Running"))
    await manager.sync_all()
    await manager.sync_all()
    assert seen == ["PATCH"]
    store.set(pods.pods["uid-web"], PodStatus(phase="Failed"))
    await manager.sync_all()
    assert seen == ["PATCH", "PATCH"]


async def test_a_status_changed_while_the_last_was_being_sent_is_sent_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The pod's status changes while the previous one is on its way to the API server (its
    container exits as the status saying it runs is sent): the manager must not wait for its
    next period (10 s) to send the new one."""
    pods, store = APIPods(), PodStatusStore()
    pods.take(api_pod("web"))
    pods.synced = True
    pod = pods.pods["uid-web"]
    store.set(pod, PodStatus(phase="Running"))
    sent: list[tuple[float, str]] = []

    async def send(request: httpx.Request) -> httpx.Response:
        phase = json.loads(request.content)["status"]["phase"]
        sent.append((trio.current_time(), phase))
        await trio.sleep(0.5)  # the API server answering
        if phase == "Running":  # meanwhile its container exited
            store.set(pod, PodStatus(phase="Succeeded"))
        return httpx.Response(200, json={"status": {"phase": phase}})

    connection = Connection(server="http://api.test", ssl_context=None)
    client = APIClient(connection, transport=httpx.MockTransport(send))
    manager = StatusManager(client, store, pods, wall_time=lambda: "2026-11-22T10:00:00Z")
    start = trio.current_time()
    with trio.move_on_after(5):
        await manager.run()
    assert [(round(at - start, 1), phase) for at, phase in sent] == [
        (0.0, "Running"), (0.5, "Succeeded")]

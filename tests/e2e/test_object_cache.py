"""The ConfigMap/Secret cache with a node's own credentials against the real kube-apiserver.

No agent runs: a pod object bound to the node is what makes the Node authorizer let the node
read the objects it references, and deny everything else.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from tests.e2e.agent import JSON, Api
from tests.e2e.conftest import ControlPlane
from trio_kubelet.apiserver import errors
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import load_kubeconfig
from trio_kubelet.apiserver.object_cache import NotRegistered, ObjectCache
from trio_kubelet.model.pod import Pod

NODE = "objects-node"
NS = "/api/v1/namespaces/default"
CONFIG = "objects-config"
SECRET = "objects-secret"
MISSING = "objects-missing"  # referenced, never created
UNREFERENCED = "objects-unreferenced"
POD = "objects-pod"


def pod_manifest() -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "env": [
                        {
                            "name": "MODE",
                            "valueFrom": {"configMapKeyRef": {"name": CONFIG, "key": "mode"}},
                        }
                    ],
                    "envFrom": [{"configMapRef": {"name": MISSING, "optional": True}}],
                }
            ],
            "volumes": [{"name": "creds", "secret": {"secretName": SECRET}}],
        },
    }


async def answered(cache: ObjectCache, names: list[str]) -> None:
    """Wait until each named object had its first answer, woken as a pod worker is."""
    with trio.fail_after(15):
        while True:
            woken = trio.Event()
            if not cache.unanswered("default", names, woken.set):
                return
            await woken.wait()


@pytest.fixture
def bound_pod(control_plane: ControlPlane) -> Iterator[tuple[Api, Pod]]:
    """The objects and a pod bound to NODE referencing them, created as admin; deleted after."""
    with control_plane.admin() as client:
        admin = Api(client)
        admin.ensure_namespace_defaults(control_plane.ca)
        admin.create(f"{NS}/configmaps", {"metadata": {"name": CONFIG}, "data": {"mode": "one"}})
        admin.create(f"{NS}/configmaps", {"metadata": {"name": UNREFERENCED}, "data": {}})
        admin.create(f"{NS}/secrets", {"metadata": {"name": SECRET}, "stringData": {"pw": "x"}})
        try:
            yield admin, Pod.model_validate(admin.create(f"{NS}/pods", pod_manifest()))
        finally:
            admin.delete(f"{NS}/pods/{POD}", grace=0)
            for path in (f"configmaps/{CONFIG}", f"configmaps/{UNREFERENCED}", f"secrets/{SECRET}"):
                admin.delete(f"{NS}/{path}")


async def test_the_node_reads_and_follows_what_its_pod_references_and_nothing_else(
    control_plane: ControlPlane, bound_pod: tuple[Api, Pod]
) -> None:
    admin, pod = bound_pod
    client = APIClient(load_kubeconfig(control_plane.node_kubeconfig(NODE)))
    config_maps = ObjectCache(client, "configmaps")
    secrets = ObjectCache(client, "secrets")
    # A pod the API server has never seen, as if it referenced the unreferenced ConfigMap.
    stranger = Pod.model_validate(
        {**pod_manifest(), "metadata": {"name": "x", "namespace": "default", "uid": "stranger"}}
    )
    stranger.spec.containers[0].env[0].value_from = {
        "configMapKeyRef": {"name": UNREFERENCED, "key": "k"}
    }
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(config_maps.run)
            await nursery.start(secrets.run)
            for cache in (config_maps, secrets):
                cache.register_pod(pod)
            config_maps.register_pod(stranger)
            await answered(config_maps, [CONFIG, MISSING, UNREFERENCED])
            await answered(secrets, [SECRET])

            assert config_maps.get("default", CONFIG)["data"] == {"mode": "one"}
            assert secrets.get("default", SECRET)["data"] == {"pw": "eA=="}
            with pytest.raises(errors.NotFound):
                config_maps.get("default", MISSING)
            with pytest.raises(errors.Forbidden) as denied:
                config_maps.get("default", UNREFERENCED)
            assert denied.value.status == 403
            assert f"system:node:{NODE}" in denied.value.message

            await trio.to_thread.run_sync(
                lambda: admin.client.patch(
                    f"{NS}/configmaps/{CONFIG}",
                    json={"data": {"mode": "two"}},
                    headers={"Content-Type": "application/merge-patch+json"},
                ).raise_for_status()
            )
            with trio.fail_after(20):  # the watch's update, on a loaded box
                while config_maps.get("default", CONFIG)["data"] != {"mode": "two"}:
                    await trio.sleep(0.05)

            config_maps.unregister_pod(str(pod.metadata.uid))
            with pytest.raises(NotRegistered):
                config_maps.get("default", CONFIG)
            nursery.cancel_scope.cancel()
    finally:
        await client.aclose()

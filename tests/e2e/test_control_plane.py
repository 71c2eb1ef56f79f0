"""The control-plane fixture works: kube-apiserver is ready, admin can do anything, a node
identity is held to its own Node (Node authorizer + NodeRestriction), and the API server can be
stopped and started again without losing state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

if TYPE_CHECKING:
    from tests.e2e.conftest import ControlPlane

pytestmark = pytest.mark.e2e
# Not control_plane.node: other e2e tests may run a kubelet registered under that name.
SMOKE_NODE = "smoke-node"


def node_object(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


def delete_node(control_plane: ControlPlane, name: str) -> None:
    with control_plane.admin() as admin:
        response = admin.delete(f"/api/v1/nodes/{name}")
        assert response.status_code in (200, 404), response.text


@pytest.fixture
def fresh_node(control_plane: ControlPlane) -> Iterator[str]:
    """SMOKE_NODE, with no Node object before and after the test; credentials made on demand."""
    delete_node(control_plane, SMOKE_NODE)  # a reused control plane may still have one
    yield SMOKE_NODE
    delete_node(control_plane, SMOKE_NODE)


def test_apiserver_is_ready(control_plane: ControlPlane) -> None:
    with control_plane.admin() as admin:
        response = admin.get("/readyz")
    assert (response.status_code, response.text) == (200, "ok")


def test_admin_lists_namespaces(control_plane: ControlPlane) -> None:
    with control_plane.admin() as admin:
        response = admin.get("/api/v1/namespaces")
    assert response.status_code == 200, response.text
    names = {item["metadata"]["name"] for item in response.json()["items"]}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= names


def test_node_creates_and_gets_its_own_node(control_plane: ControlPlane, fresh_node: str) -> None:
    with control_plane.node_client(fresh_node) as node:
        created = node.post("/api/v1/nodes", json=node_object(fresh_node))
        assert created.status_code == 201, created.text
        fetched = node.get(f"/api/v1/nodes/{fresh_node}")
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["metadata"]["uid"] == created.json()["metadata"]["uid"]


def test_node_cannot_create_another_nodes_node(control_plane: ControlPlane) -> None:
    with control_plane.node_client(SMOKE_NODE) as node:
        response = node.post("/api/v1/nodes", json=node_object("someone-else"))
    assert response.status_code == 403, response.text
    message = response.json()["message"]
    assert f'node "{SMOKE_NODE}" is not allowed to modify node "someone-else"' in message


def test_node_kubeconfig_embeds_the_credentials(control_plane: ControlPlane) -> None:
    config = yaml.safe_load(control_plane.node_kubeconfig().read_text())
    (cluster,) = config["clusters"]
    assert cluster["cluster"]["server"] == control_plane.server
    (user,) = config["users"]
    assert user["name"] == f"system:node:{control_plane.node}"
    assert {"client-certificate-data", "client-key-data"} <= user["user"].keys()


def test_apiserver_stops_and_starts_with_its_state(
    control_plane: ControlPlane, fresh_node: str
) -> None:
    with control_plane.node_client(fresh_node) as node:
        assert node.post("/api/v1/nodes", json=node_object(fresh_node)).status_code == 201
    control_plane.stop_apiserver()
    try:
        with control_plane.admin() as admin, pytest.raises(httpx.ConnectError):
            admin.get("/readyz")
    finally:
        control_plane.start_apiserver()
    with control_plane.admin() as admin:
        assert admin.get(f"/api/v1/nodes/{fresh_node}").status_code == 200

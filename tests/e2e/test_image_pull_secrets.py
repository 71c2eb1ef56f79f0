"""A private image through the whole agent: an API pod whose imagePullSecrets name a
dockerconfigjson Secret for a password-protected local registry runs; the same image without
the secret is ErrImagePull / ImagePullBackOff."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.containerd_fixture import Containerd
from tests.e2e.agent import PODS, Api, node_admin, node_agent, pod_manifest
from tests.e2e.conftest import ControlPlane
from tests.registry_fixture import running_registry

pytestmark = pytest.mark.e2e
NODE = "private-images-node"
SECRETS = "/api/v1/namespaces/default/secrets"


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Api]:
    with control_plane.admin() as client, node_admin(client, NODE, control_plane.ca) as admin:
        try:
            yield admin
        finally:
            admin.delete(f"{SECRETS}/regcred")


def docker_config_secret(host: str, user: str, password: str) -> dict[str, Any]:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = json.dumps({"auths": {host: {"auth": auth}}}).encode()
    return {
        "metadata": {"name": "regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    }


def waiting_reason(pod: dict[str, Any] | None) -> str | None:
    for status in (pod or {}).get("status", {}).get("containerStatuses", []):
        return status.get("state", {}).get("waiting", {}).get("reason")  # type: ignore[no-any-return]
    return None


def test_a_private_image_is_pulled_with_the_pods_pull_secret(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> None:
    with running_registry(containerd, user=("alice", "s3cret")) as registry, \
            node_agent(control_plane, containerd.endpoint, tmp_path, NODE):
        image = registry.push("tk/private", "v1")
        api.create(PODS, pod_manifest("anonymous", NODE, image, ["sleep", "3600"]))
        api.wait(
            f"{PODS}/anonymous",
            lambda p: waiting_reason(p) in ("ErrImagePull", "ImagePullBackOff"),
            what="the pod without a pull secret failing to pull",
        )

        api.create(SECRETS, docker_config_secret(registry.host, "alice", "s3cret"))
        api.create(PODS, pod_manifest("private", NODE, image, ["sleep", "3600"],
                                      imagePullSecrets=[{"name": "regcred"}]))
        running = api.wait(
            f"{PODS}/private",
            lambda p: (p or {}).get("status", {}).get("phase") == "Running",
            timeout=90,
            what="the pod with the pull secret running",
        )
        assert running is not None
        assert running["status"]["containerStatuses"][0]["image"].endswith("tk/private:v1")
        assert registry.manifest_requests("tk/private", "v1") >= 2  # one refused, one allowed

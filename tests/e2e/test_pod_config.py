"""What pods read from the cluster, end to end: ConfigMap and Secret env vars and volumes (updated
in place, atomically), and the service-account token volume the API server injects."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containerd_fixture import Containerd
from tests.e2e.agent import (
    PODS,
    AgentProcess,
    Api,
    condition,
    container_status,
    node_admin,
    node_agent,
    pod_manifest,
)
from tests.e2e.conftest import ControlPlane

NODE = "config-node"
NS = "/api/v1/namespaces/default"
# Prints the env, the secret, whether a token is mounted, then the ConfigMap file every 0.5 s.
SCRIPT = (
    'echo "env=$MODE/$PASSWORD"; cat /creds/pw; echo; '
    "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo token; "
    "while true; do echo \"file=$(cat /cfg/mode)\"; sleep 0.5; done"
)


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Api]:
    with control_plane.admin() as client, node_admin(client, NODE, control_plane.ca) as admin:
        admin.create(f"{NS}/configmaps", {"metadata": {"name": "app-config"},
                                          "data": {"mode": "one"}})
        admin.create(f"{NS}/secrets", {"metadata": {"name": "app-secret"},
                                       "stringData": {"pw": "hunter2"}})
        try:
            yield admin
        finally:
            admin.delete(f"{NS}/configmaps/app-config")
            admin.delete(f"{NS}/secrets/app-secret")


@pytest.fixture
def agent(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> Iterator[AgentProcess]:
    with node_agent(control_plane, containerd.endpoint, tmp_path, NODE) as run:
        yield run


def log_lines(api: Api, name: str) -> list[str]:
    answer = api.client.get(f"{PODS}/{name}/log")
    return answer.text.splitlines() if answer.status_code == 200 else []


def wait_for_line(api: Api, name: str, line: str, timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = log_lines(api, name)
        if line in lines:
            return lines
        time.sleep(0.5)
    raise AssertionError(f"{line!r} not in the log of {name}: {lines[-20:]}")


def test_config_maps_secrets_and_tokens_reach_the_pod(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    manifest = pod_manifest("configured", NODE, containerd.BUSYBOX_TAGGED, ["sh", "-c", SCRIPT])
    main = manifest["spec"]["containers"][0]
    main["env"] = [
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mode"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "app-secret", "key": "pw"}}},
    ]
    main["volumeMounts"] = [
        {"name": "cfg", "mountPath": "/cfg"},
        {"name": "creds", "mountPath": "/creds"},
    ]
    manifest["spec"]["volumes"] = [
        {"name": "cfg", "configMap": {"name": "app-config"}},
        {"name": "creds", "secret": {"secretName": "app-secret", "defaultMode": 0o400}},
    ]
    api.create(PODS, manifest)
    lines = wait_for_line(api, "configured", "file=one")
    assert lines[:3] == ["env=one/hunter2", "hunter2", "token"], lines[:5]

    api.client.patch(
        f"{NS}/configmaps/app-config", json={"data": {"mode": "two"}},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()
    # The agent's resync (--sync-frequency 10s here, 1m by default) rewrites the volume.
    lines = wait_for_line(api, "configured", "file=two", timeout=90)
    seen = [line for line in lines if line.startswith("file=")]
    # Atomic: every read saw one whole version, never an empty or partial file.
    assert set(seen) <= {"file=one", "file=two"}, set(seen)


def env_lines(api: Api, name: str, timeout: float = 60.0) -> dict[str, str]:
    """The ``env`` output the pod ``name`` printed (the line ``done`` ends it)."""
    lines = wait_for_line(api, name, "done", timeout)
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_service_links_reach_the_environment(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    service = api.create(
        f"{NS}/services",
        {
            "metadata": {"name": "links-demo"},
            "spec": {"ports": [{"name": "web", "port": 8080, "targetPort": 80}]},
        },
    )
    ip = service["spec"]["clusterIP"]
    master = api.get(f"{NS}/services/kubernetes")
    assert master is not None, "the API server publishes default/kubernetes"
    try:
        command = ["sh", "-c", "env; echo done; sleep 3600"]
        linked = pod_manifest("linked", NODE, containerd.BUSYBOX_TAGGED, command)
        linked["spec"]["containers"][0]["env"] = [
            {"name": "DEMO_URL", "value": "http://$(LINKS_DEMO_SERVICE_HOST):8080"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": "overridden"},
        ]
        api.create(PODS, linked)
        unlinked = pod_manifest(
            "unlinked", NODE, containerd.BUSYBOX_TAGGED, command, enableServiceLinks=False
        )
        api.create(PODS, unlinked)

        env = env_lines(api, "linked")
        assert env["LINKS_DEMO_SERVICE_HOST"] == ip
        assert env["LINKS_DEMO_SERVICE_PORT"] == "8080"
        assert env["LINKS_DEMO_SERVICE_PORT_WEB"] == "8080"
        assert env["LINKS_DEMO_PORT"] == f"tcp://{ip}:8080"
        assert env["DEMO_URL"] == f"http://{ip}:8080"  # $(VAR) sees the service variables
        assert env["KUBERNETES_SERVICE_HOST"] == master["spec"]["clusterIP"]
        assert env["KUBERNETES_SERVICE_PORT"] == "overridden"  # the container's own env wins

        env = env_lines(api, "unlinked")
        assert env["KUBERNETES_SERVICE_HOST"] == master["spec"]["clusterIP"]
        assert env["KUBERNETES_SERVICE_PORT"] == str(master["spec"]["ports"][0]["port"])
        assert not any(name.startswith("LINKS_DEMO_") for name in env), sorted(env)
    finally:
        api.delete(f"{NS}/services/links-demo")


def test_env_from_takes_every_key_and_a_missing_source_is_a_config_error(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    """envFrom as the NodeConformance specs use it ("should be consumable via the
    environment"): keys with hyphens, with and without a prefix, an optional source that
    does not exist; and a required one that does not exist, reported as Go reports it.

    The container runs busybox's ``env`` itself: Debian's busybox ``sh`` drops names that
    are not shell identifiers (``data-1``) from the environment it hands on, so ``sh -c env``
    would hide what the agent passed.
    """
    api.create(f"{NS}/configmaps", {"metadata": {"name": "env-config"},
                                    "data": {"data-1": "value-1", "data-2": "value-2"}})
    api.create(f"{NS}/secrets", {"metadata": {"name": "env-secret"},
                                 "stringData": {"secret-1": "s", "1234": "digits"}})
    try:
        manifest = pod_manifest("env-from", NODE, containerd.BUSYBOX_TAGGED, ["env"],
                                restartPolicy="Never")
        manifest["spec"]["containers"][0]["envFrom"] = [
            {"configMapRef": {"name": "env-config"}},
            {"prefix": "p-", "configMapRef": {"name": "env-config"}},
            {"secretRef": {"name": "env-secret"}},
            {"configMapRef": {"name": "env-absent", "optional": True}},
        ]
        api.create(PODS, manifest)
        api.wait(f"{PODS}/env-from", lambda p: bool(p) and p["status"].get("phase") == "Succeeded",
                 what="env-from Succeeded")
        # A fresh agent may still be starting its server when so short a pod has finished.
        lines = wait_for_line(api, "env-from", "data-1=value-1", timeout=30)
        env = dict(line.split("=", 1) for line in lines if "=" in line)
        # "1234" is no C identifier: Go >= 1.34 passes it on all the same.
        assert {k: env.get(k) for k in ("data-1", "data-2", "p-data-1", "p-data-2",
                                        "secret-1", "1234")} == {
            "data-1": "value-1", "data-2": "value-2", "p-data-1": "value-1",
            "p-data-2": "value-2", "secret-1": "s", "1234": "digits"}, env

        manifest = pod_manifest("env-missing", NODE, containerd.BUSYBOX_TAGGED, ["env"],
                                restartPolicy="Never")
        manifest["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "env-nothing"}}]
        uid = api.create(PODS, manifest)["metadata"]["uid"]
        pod = api.wait(
            f"{PODS}/env-missing",
            lambda p: (container_status(p).get("state") or {}).get("waiting", {}).get("reason")
            == "CreateContainerConfigError",
            what="env-missing waiting with CreateContainerConfigError",
        )
        waiting = container_status(pod)["state"]["waiting"]
        assert waiting["message"] == 'secret "env-nothing" not found'
        api.wait(
            f"{NS}/events?fieldSelector=involvedObject.uid={uid},reason=Failed",
            lambda events: any(e["message"] == 'Error: secret "env-nothing" not found'
                               for e in (events or {}).get("items", [])),
            timeout=20,
            what="the Failed event",
        )
    finally:
        api.delete(f"{NS}/configmaps/env-config")
        api.delete(f"{NS}/secrets/env-secret")


def test_a_new_pod_waits_for_the_objects_it_mounts_instead_of_failing(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    """Every pod here gets the service-account volume (token, kube-root-ca.crt, namespace):
    its first set-up waits for the cache's first answers, so no FailedMount is ever
    reported for it. An object that does not exist is reported once the cache has listed
    it, with Go's message."""
    manifest = pod_manifest("prompt", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"])
    uid = api.create(PODS, manifest)["metadata"]["uid"]
    pod = api.wait(f"{PODS}/prompt", lambda p: condition(p, "Ready") == "True",
                   what="prompt Ready")
    assert any(v.get("projected") for v in pod["spec"]["volumes"]), "kube-api-access-* volume"

    manifest = pod_manifest("unmountable", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"])
    manifest["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    manifest["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "nothing-here"}}]
    lost = api.create(PODS, manifest)["metadata"]["uid"]
    expected = 'MountVolume.SetUp failed for volume "cfg" : configmap "nothing-here" not found'
    events = api.wait(
        f"{NS}/events?fieldSelector=involvedObject.uid={lost},reason=FailedMount",
        lambda found: bool((found or {}).get("items")),
        timeout=20,
        what="the unmountable pod's FailedMount",
    )
    assert [e["message"] for e in events["items"]] == [expected]
    mounts = api.get(f"{NS}/events?fieldSelector=involvedObject.uid={uid},reason=FailedMount")
    assert mounts is not None and mounts["items"] == [], [e["message"] for e in mounts["items"]]

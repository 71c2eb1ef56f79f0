"""Joining a cluster as kubeadm nodes do, against the join control plane (kube-controller-manager
signing and approving CSRs, kube-apiserver verifying kubelets' serving certificates): TLS
bootstrap with only --bootstrap-kubeconfig."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from tests.containerd_fixture import Containerd
from tests.e2e.agent import (
    JSON,
    PODS,
    AgentProcess,
    Api,
    condition,
    node_admin,
    pod_manifest,
    running_agent,
)
from tests.e2e.conftest import ControlPlane
from tests.e2e.csr import CSRS

pytestmark = pytest.mark.e2e

NODE = "join-node"


@pytest.fixture
def api(join_control_plane: ControlPlane) -> Iterator[Api]:
    with (
        join_control_plane.admin() as client,
        node_admin(client, NODE, join_control_plane.ca) as admin,
    ):
        yield admin
        admin.delete(f"/api/v1/nodes/{NODE}")
        for csr in (admin.get(CSRS) or {}).get("items", []):
            if csr["spec"]["username"] in (f"system:node:{NODE}",) or csr["metadata"][
                "name"
            ].startswith("node-csr-"):
                admin.delete(f"{CSRS}/{csr['metadata']['name']}")


@contextmanager
def bootstrapping_agent(
    cp: ControlPlane, containerd: Containerd, tmp: Path, *extra: str
) -> Iterator[AgentProcess]:
    """The agent of NODE with only the bootstrap kubeconfig: --kubeconfig does not exist yet."""
    with running_agent(
        tmp,
        NODE,
        tmp / "kubelet.conf",
        containerd.endpoint,
        cp.ca,
        "--bootstrap-kubeconfig",
        str(cp.bootstrap_kubeconfig),
        "--cert-dir",
        str(tmp / "pki"),
        *extra,
    ) as run:
        try:
            yield run
        finally:
            print(run.text()[-8000:])


def node_ready(node: JSON | None) -> bool:
    for cond in ((node or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return bool(cond["status"] == "True")
    return False


def running(pod: JSON | None) -> bool:
    return (
        bool(pod) and pod["status"].get("phase") == "Running" and condition(pod, "Ready") == "True"
    )


def wait_for_log(run: AgentProcess, text: str, *, starts: int, timeout: float = 60) -> str:
    """Wait until the agent's ``starts``-th run has logged ``text``; that run's log."""
    deadline = time.monotonic() + timeout
    while True:
        runs = run.text().split("starting on node")[1:]
        if len(runs) >= starts and text in runs[starts - 1]:
            return runs[starts - 1]
        if time.monotonic() > deadline:
            raise AssertionError(f"run {starts} of the agent did not log {text!r} in {timeout}s")
        time.sleep(0.2)


def issued_client_certificate(tmp: Path) -> x509.Certificate:
    current = tmp / "pki" / "kubelet-client-current.pem"
    return x509.load_pem_x509_certificates(current.read_bytes())[0]


def test_a_node_with_only_a_bootstrap_kubeconfig_joins_and_runs_a_pod(
    join_control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> None:
    kubeconfig = tmp_path / "kubelet.conf"
    assert not kubeconfig.exists()
    with bootstrapping_agent(join_control_plane, containerd, tmp_path):
        node = api.wait(f"/api/v1/nodes/{NODE}", node_ready, timeout=90, what="the Node Ready")
        assert node is not None
        api.create(PODS, pod_manifest("joined", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"]))
        api.wait(f"{PODS}/joined", running, timeout=90, what="the pod Running")

        # The client certificate came from the cluster: signed by its CA, for this node, through
        # a bootstrap CSR the bootstrap token sent and kube-controller-manager approved.
        cert = issued_client_certificate(tmp_path)
        ca = x509.load_pem_x509_certificate(join_control_plane.ca.read_bytes())
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
            f"system:node:{NODE}"
        )
        current = tmp_path / "pki" / "kubelet-client-current.pem"
        assert current.is_symlink()
        assert os.readlink(current).startswith(str(tmp_path / "pki" / "kubelet-client-20"))
        assert not (tmp_path / "pki" / "kubelet-client.key.tmp").exists()
        csrs = [
            csr
            for csr in (api.get(CSRS) or {})["items"]
            if csr["metadata"]["name"].startswith("node-csr-")
            and csr["spec"]["username"].startswith("system:bootstrap:")
        ]
        assert len(csrs) == 1, csrs
        assert csrs[0]["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
        assert csrs[0]["spec"]["usages"] == ["digital signature", "client auth"]
        assert [c["reason"] for c in csrs[0]["status"]["conditions"]] == ["AutoApproved"]

        # The kubeconfig written points at the store's current pair, as Go's does.
        config = yaml.safe_load(kubeconfig.read_text())
        (user,) = config["users"]
        assert user["user"] == {"client-certificate": str(current), "client-key": str(current)}
        assert config["clusters"][0]["cluster"]["server"] == join_control_plane.server
    # A restart uses the kubeconfig: no second bootstrap.
    with bootstrapping_agent(join_control_plane, containerd, tmp_path) as run:
        second_start = wait_for_log(run, "Listed pods bound to node", starts=2)
        assert "TLS bootstrap" not in second_start
        api.wait(f"{PODS}/joined", running, timeout=60, what="the pod still Running")
    bootstrap_csrs = [
        csr
        for csr in (api.get(CSRS) or {})["items"]
        if csr["metadata"]["name"].startswith("node-csr-")
    ]
    assert len(bootstrap_csrs) == 1

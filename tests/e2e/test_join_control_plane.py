"""The join control plane works as kubeadm's does for a joining node: the bootstrap token may
send a node client CSR, kube-controller-manager approves and signs it with the cluster CA, the
issued certificate is the node's identity, a node renews its own certificate the same way, and a
kubelet-serving CSR waits for an operator's approval."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.e2e.csr import CSRS, approve, node_csr, wait_issued

if TYPE_CHECKING:
    from tests.e2e.conftest import ControlPlane

pytestmark = pytest.mark.e2e


def unique_node() -> str:
    return f"csr-{uuid.uuid4().hex[:8]}"


def write_pair(
    tmp: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_file, key_file = tmp / "node.crt", tmp / "node.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def test_bootstrap_token_gets_a_node_client_certificate(
    join_control_plane: ControlPlane, tmp_path: Path
) -> None:
    node = unique_node()
    body, key = node_csr(node, f"node-csr-{node}")
    with join_control_plane.bootstrap_client() as bootstrap:
        created = bootstrap.post(CSRS, json=body)
        assert created.status_code == 201, created.text
        assert created.json()["spec"]["username"].startswith("system:bootstrap:")
        cert = wait_issued(bootstrap, body["metadata"]["name"])
        (approved,) = bootstrap.get(f"{CSRS}/{body['metadata']['name']}").json()["status"][
            "conditions"
        ]
    assert (approved["type"], approved["reason"]) == ("Approved", "AutoApproved")
    ca = x509.load_pem_x509_certificate(join_control_plane.ca.read_bytes())
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        f"system:node:{node}"
    )
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # The issued certificate is the node's identity: the Node authorizer lets it create its Node.
    with join_control_plane.certificate_client(*write_pair(tmp_path, cert, key)) as client:
        answer = client.post(
            "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
        )
        assert answer.status_code == 201, answer.text
    with join_control_plane.admin() as admin:
        assert admin.delete(f"/api/v1/nodes/{node}").status_code == 200


def test_bootstrap_token_reads_nothing_else(join_control_plane: ControlPlane) -> None:
    with join_control_plane.bootstrap_client() as bootstrap:
        answer = bootstrap.get("/api/v1/namespaces/default/pods")
    assert answer.status_code == 403, answer.text
    assert "system:bootstrap:" in answer.json()["message"]


def test_a_node_renews_its_own_client_certificate(
    join_control_plane: ControlPlane, tmp_path: Path
) -> None:
    """selfnodeclient: a CSR for system:node:N sent as system:node:N is approved too."""
    node = unique_node()
    body, key = node_csr(node, f"node-csr-{node}")
    with join_control_plane.bootstrap_client() as bootstrap:
        assert bootstrap.post(CSRS, json=body).status_code == 201
        first = wait_issued(bootstrap, body["metadata"]["name"])
    renewal, _ = node_csr(node, f"renewal-{node}")
    with join_control_plane.certificate_client(*write_pair(tmp_path, first, key)) as client:
        created = client.post(CSRS, json=renewal)
        assert created.status_code == 201, created.text
        assert created.json()["spec"]["username"] == f"system:node:{node}"
        second = wait_issued(client, renewal["metadata"]["name"])
    assert second.serial_number != first.serial_number


def test_kubelet_serving_csr_waits_for_an_operator(join_control_plane: ControlPlane) -> None:
    node = unique_node()
    body, _ = node_csr(
        node, f"serving-{node}", signer="kubernetes.io/kubelet-serving", ips=("127.0.0.1",)
    )
    body["spec"]["usages"] = ["digital signature", "server auth"]
    with join_control_plane.admin() as admin:
        assert admin.post(CSRS, json=body).status_code == 201
        time.sleep(2)  # long enough for the csrapproving controller to have seen it
        pending = admin.get(f"{CSRS}/{body['metadata']['name']}").json()
        assert not (pending.get("status") or {}).get("conditions"), pending
        approve(admin, body["metadata"]["name"])
        cert = wait_issued(admin, body["metadata"]["name"])
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]

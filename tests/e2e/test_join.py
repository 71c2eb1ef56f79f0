"""Joining a cluster as kubeadm nodes do, against the join control plane (kube-controller-manager
signing and approving CSRs, kube-apiserver verifying kubelets' serving certificates): TLS
bootstrap with only --bootstrap-kubeconfig."""

from __future__ import annotations

import base64
import datetime
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterator
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
    container_status,
    joining_node_admin,
    pod_manifest,
    running_agent,
)
from tests.e2e.conftest import ControlPlane, kubectl
from tests.e2e.csr import CSRS, approve

pytestmark = pytest.mark.e2e

NODE = "join-node"


@pytest.fixture
def api(join_control_plane: ControlPlane) -> Iterator[Api]:
    with joining_node_admin(join_control_plane, NODE) as admin:
        yield admin
        for csr in (admin.get(CSRS) or {}).get("items", []):
            if csr["metadata"]["name"].startswith("node-csr-"):  # the bootstrap token's
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


def requested_name(csr: JSON) -> str:
    """The common name a CertificateSigningRequest asks for."""
    request = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
    return str(request.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


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
        # The join control plane is shared: other nodes' bootstrap CSRs (test_install's) are there.
        csrs = [
            csr
            for csr in (api.get(CSRS) or {})["items"]
            if csr["metadata"]["name"].startswith("node-csr-")
            and csr["spec"]["username"].startswith("system:bootstrap:")
            and requested_name(csr) == f"system:node:{NODE}"
        ]
        assert len(csrs) == 1, csrs
        assert csrs[0]["spec"]["signerName"] == "kubernetes.io/kube-apiserver-client-kubelet"
        assert csrs[0]["spec"]["usages"] == ["digital signature", "client auth"]
        assert [c["reason"] for c in csrs[0]["status"]["conditions"]] == ["AutoApproved"]

        # status.images lists the runtime's images, busybox among them, largest first.
        node = api.wait(
            f"/api/v1/nodes/{NODE}",
            lambda n: any(
                containerd.BUSYBOX_TAGGED in name
                for image in (n or {}).get("status", {}).get("images") or []
                for name in image["names"]
            ),
            timeout=40,
            what="busybox in status.images",
        )
        sizes = [image["sizeBytes"] for image in node["status"]["images"]]  # type: ignore[index]
        assert sizes == sorted(sizes, reverse=True)

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
        and requested_name(csr) == f"system:node:{NODE}"
    ]
    assert len(bootstrap_csrs) == 1


@pytest.fixture
def short_certificates(join_control_plane: ControlPlane) -> Iterator[None]:
    """kube-controller-manager signs 3-minute certificates (8 minutes with the 5 it backdates)
    for the test; the default duration again after it."""
    join_control_plane.start_controller_manager("--cluster-signing-duration", "3m")
    yield
    join_control_plane.start_controller_manager()


LEASE = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"


def renewed_after(moment: datetime.datetime) -> Callable[[JSON | None], bool]:
    """Whether the node's Lease was last renewed after ``moment``."""
    def check(lease: JSON | None) -> bool:
        return lease is not None and datetime.datetime.fromisoformat(
            lease["spec"]["renewTime"]) > moment
    return check


def test_the_client_certificate_rotates_without_pod_restarts_or_watch_failures(
    join_control_plane: ControlPlane,
    containerd: Containerd,
    tmp_path: Path,
    api: Api,
    short_certificates: None,
) -> None:
    ca = x509.load_pem_x509_certificate(join_control_plane.ca.read_bytes())
    with bootstrapping_agent(
        join_control_plane, containerd, tmp_path, "--rotate-certificates"
    ) as run:
        api.wait(f"/api/v1/nodes/{NODE}", node_ready, timeout=90, what="the Node Ready")
        api.create(PODS, pod_manifest("steady", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"]))
        before = api.wait(f"{PODS}/steady", running, timeout=90, what="steady Running")
        first = issued_client_certificate(tmp_path)
        assert first.not_valid_after_utc - first.not_valid_before_utc == datetime.timedelta(
            minutes=8
        )

        # Renewed 70-90 % into its 8 minutes: 36 to 132 s after it was issued, plus the CSR's
        # round trip (created, auto-approved, signed) on a loaded box.
        deadline = time.monotonic() + 200
        while issued_client_certificate(tmp_path).serial_number == first.serial_number:
            assert time.monotonic() < deadline, "no rotation within 200 s"
            time.sleep(1)
        second = issued_client_certificate(tmp_path)
        second.verify_directly_issued_by(ca)
        assert second.subject == first.subject
        renewal_life = second.not_valid_before_utc - first.not_valid_before_utc
        assert datetime.timedelta(seconds=30) <= renewal_life <= datetime.timedelta(seconds=150)
        renewals = [
            csr
            for csr in (api.get(CSRS) or {})["items"]
            if csr["spec"]["username"] == f"system:node:{NODE}"
        ]
        assert renewals, "the renewal CSR is sent as the node itself"
        assert renewals[0]["metadata"]["name"].startswith("csr-")
        assert [c["reason"] for c in renewals[0]["status"]["conditions"]] == ["AutoApproved"]

        # Past the first certificate's end every new connection must carry a renewed one.
        wait = (first.not_valid_after_utc - datetime.datetime.now(datetime.UTC)).total_seconds()
        time.sleep(max(0.0, wait) + 15)
        api.create(
            PODS, pod_manifest("after-expiry", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"])
        )
        api.wait(f"{PODS}/after-expiry", running, timeout=60, what="a new pod Running")
        # The Lease (renewed every ~10 s) renews past the first certificate's end: with the
        # renewed certificate. Polled, as a loaded box can delay a round.
        api.wait(LEASE, renewed_after(first.not_valid_after_utc), timeout=30,
                 what="a Lease renewal after the first certificate's end")
        after = container_status(api.get(f"{PODS}/steady"))
        assert after["restartCount"] == 0
        assert after["containerID"] == container_status(before)["containerID"]
        assert after["state"]["running"] == container_status(before)["state"]["running"]
        log = run.text()
        assert "Renewed the client certificate" in log
        for failure in ("Cannot list/watch", "Unauthorized", "expired (resourceVersion"):
            assert failure not in log, failure


def served_certificate(port: int) -> x509.Certificate | None:
    """The certificate 10250 presents now, or None when it refuses the handshake."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
            context.wrap_socket(sock) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return x509.load_der_x509_certificate(der) if der else None


def serving_csrs(api: Api) -> list[JSON]:
    return [
        csr
        for csr in (api.get(CSRS) or {})["items"]
        if csr["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
        and csr["spec"]["username"] == f"system:node:{NODE}"
    ]


def approve_next_serving_csr(api: Api, seen: int, timeout: float = 200) -> JSON:
    """Wait for the node's serving CSR number ``seen + 1``, approve it (as an operator would with
    `kubectl certificate approve`), return it."""
    deadline = time.monotonic() + timeout
    while len(csrs := serving_csrs(api)) <= seen:
        assert time.monotonic() < deadline, f"no serving CSR number {seen + 1} in {timeout}s"
        time.sleep(0.5)
    newest = max(csrs, key=lambda csr: csr["metadata"]["creationTimestamp"])
    approve(api.client, newest["metadata"]["name"])
    return newest


def test_server_tls_bootstrap_serves_a_cluster_certificate_the_api_server_verifies(
    join_control_plane: ControlPlane,
    containerd: Containerd,
    tmp_path: Path,
    api: Api,
    short_certificates: None,
    clients: Path,
) -> None:
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "serverTLSBootstrap: true\n"
    )
    ca = x509.load_pem_x509_certificate(join_control_plane.ca.read_bytes())
    with bootstrapping_agent(
        join_control_plane, containerd, tmp_path, "--config", str(config)
    ) as run:
        api.wait(f"/api/v1/nodes/{NODE}", node_ready, timeout=90, what="the Node Ready")
        api.create(
            PODS,
            pod_manifest(
                "served", NODE, containerd.BUSYBOX_TAGGED, ["sh", "-c", "echo hello; sleep 3600"]
            ),
        )
        api.wait(f"{PODS}/served", running, timeout=90, what="the pod Running")
        # Nothing is served until the CSR is approved (kube-controller-manager does not).
        assert served_certificate(run.port) is None
        logs = kubectl(clients, join_control_plane, "logs", "served")
        assert logs.returncode != 0

        csr = approve_next_serving_csr(api, 0)
        assert csr["spec"]["usages"] == ["digital signature", "server auth"]
        deadline = time.monotonic() + 30
        while (first := served_certificate(run.port)) is None:
            assert time.monotonic() < deadline, "10250 serves no certificate after approval"
            time.sleep(0.5)
        first.verify_directly_issued_by(ca)
        sans = first.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        assert sans.get_values_for_type(x509.DNSName) == [NODE]

        # The API server reaches the kubelet verifying its certificate against the cluster CA.
        logs = kubectl(clients, join_control_plane, "logs", "served")
        assert (logs.returncode, logs.stdout) == (0, "hello\n"), logs.stderr
        done = kubectl(
            clients, join_control_plane, "exec", "served", "--", "sh", "-c", "echo in; exit 4"
        )
        assert (done.returncode, done.stdout) == (4, "in\n"), done.stderr

        # Renewed like the client certificate (each renewal approved again); new connections get
        # the new one.
        approve_next_serving_csr(api, 1)
        deadline = time.monotonic() + 30
        while (second := served_certificate(run.port)) is None or (
            second.serial_number == first.serial_number
        ):
            assert time.monotonic() < deadline, "the renewed serving certificate is not served"
            time.sleep(0.5)
        second.verify_directly_issued_by(ca)
        logs = kubectl(clients, join_control_plane, "logs", "served")
        assert (logs.returncode, logs.stdout) == (0, "hello\n"), logs.stderr


def test_a_self_signed_kubelet_is_refused_by_a_verifying_api_server(
    join_control_plane: ControlPlane,
    containerd: Containerd,
    tmp_path: Path,
    api: Api,
    clients: Path,
) -> None:
    """The other side of --kubelet-certificate-authority: without serverTLSBootstrap the
    kubelet's self-signed certificate does not verify, so logs cannot be fetched."""
    with bootstrapping_agent(join_control_plane, containerd, tmp_path) as run:
        api.create(
            PODS,
            pod_manifest(
                "unverified", NODE, containerd.BUSYBOX_TAGGED, ["sh", "-c", "echo x; sleep 3600"]
            ),
        )
        api.wait(f"{PODS}/unverified", running, timeout=90, what="the pod Running")
        # The agent's server may start after its first pod runs: wait for its certificate.
        deadline = time.monotonic() + 30
        while served_certificate(run.port) is None:
            assert time.monotonic() < deadline, "10250 serves no certificate"
            time.sleep(0.5)
        logs = kubectl(clients, join_control_plane, "logs", "unverified")
    assert logs.returncode != 0
    assert "x509" in logs.stderr or "certificate" in logs.stderr, logs.stderr

"""certificate/: the file store, sending and waiting for CSRs, and which client credentials the
agent starts with (kubeconfig, store, or a TLS bootstrap)."""

from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import random
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.certificates_fake import CA, CSRApi
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import Connection, KubeconfigError
from trio_kubelet.certificate.client import client_credentials
from trio_kubelet.certificate.csr import CertificateRequestError, obtain_certificate
from trio_kubelet.certificate.keys import (
    KeyPair,
    key_pair,
    load_private_key,
    new_private_key,
    public_key_der,
)
from trio_kubelet.certificate.rotation import rotate_forever
from trio_kubelet.certificate.serving import ServingCertificateManager
from trio_kubelet.certificate.store import CertificateStore
from trio_kubelet.cli import parse_run_options
from trio_kubelet.config import AgentOptions
from trio_kubelet.core.certificates import (
    CLIENT_SIGNER,
    bootstrap_csr_name,
    client_template,
    client_usages,
)

NOW = datetime.datetime.now(datetime.UTC)


@pytest.fixture(scope="module")
def ca() -> CA:
    return CA()


# --- the store ---------------------------------------------------------------------------


def test_store_writes_a_dated_file_and_points_current_at_it(ca: CA, tmp_path: Path) -> None:
    store = CertificateStore("kubelet-client", tmp_path / "pki")
    assert store.current() is None
    cert, key = ca.node_pair("n1")
    stamp = datetime.datetime(2026, 3, 4, 5, 6, 7).astimezone()
    pair = store.update(cert, key, stamp)
    dated = tmp_path / "pki" / "kubelet-client-2026-03-04-05-06-07.pem"
    assert os.readlink(store.current_path) == str(dated)
    assert dated.stat().st_mode & 0o777 == 0o600
    assert dated.read_bytes() == cert + key
    assert store.current() == pair and pair.facts.common_name == "system:node:n1"
    second = store.update(*ca.node_pair("n1"), stamp + datetime.timedelta(seconds=1))
    assert store.current() == second and dated.exists()  # the old pair is kept, as Go keeps it


def test_store_refuses_a_key_that_is_not_the_certificates(ca: CA, tmp_path: Path) -> None:
    store = CertificateStore("kubelet-client", tmp_path)
    cert, _ = ca.node_pair("n1")
    with pytest.raises(Exception, match="do not go together"):
        store.update(cert, new_private_key(), NOW)
    assert not store.current_path.exists()


def test_store_takes_up_an_interrupted_switch(ca: CA, tmp_path: Path) -> None:
    store = CertificateStore("kubelet-client", tmp_path)
    pair = store.update(*ca.node_pair("n1"), NOW)
    target = os.readlink(store.current_path)
    store.current_path.unlink()
    os.symlink(target, tmp_path / "kubelet-client-updated.pem")
    assert store.current() == pair and store.current_path.is_symlink()


def test_an_unusable_current_file_counts_as_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CertificateStore("kubelet-client", tmp_path)
    store.current_path.write_bytes(b"garbage")
    assert store.current() is None
    assert "Cannot use" in caplog.text


# --- CSRs ---------------------------------------------------------------------------------


def api_for(fake: CSRApi) -> APIClient:
    return APIClient(Connection("http://api.test", None), transport=fake.transport())


async def test_obtain_sends_the_csr_and_returns_the_issued_certificate(ca: CA) -> None:
    fake = CSRApi(ca)
    key = load_private_key(new_private_key())
    usages = client_usages(rsa_key=False)
    certificate = await obtain_certificate(
        api_for(fake), key, client_template("n1"), signer=CLIENT_SIGNER, usages=usages, now=NOW
    )
    (sent,) = fake.created
    assert sent["metadata"]["name"] == "csr-0"  # generateName: the server names it
    assert sent["spec"]["signerName"] == CLIENT_SIGNER
    assert sent["spec"]["usages"] == ["digital signature", "client auth"]
    assert certificate.startswith(b"-----BEGIN CERTIFICATE-----")


async def test_a_denied_csr_is_an_error_naming_the_reason(ca: CA) -> None:
    fake = CSRApi(ca, decide="deny")
    key = load_private_key(new_private_key())
    with pytest.raises(CertificateRequestError, match="denied, reason: NotYou, message: go away"):
        await obtain_certificate(
            api_for(fake),
            key,
            client_template("n1"),
            signer=CLIENT_SIGNER,
            usages=client_usages(rsa_key=False),
            now=NOW,
        )


async def test_a_named_csr_that_exists_is_taken_up_if_it_is_ours(ca: CA) -> None:
    fake = CSRApi(ca)
    key = load_private_key(new_private_key())
    usages = client_usages(rsa_key=False)
    name = bootstrap_csr_name(public_key_der(key), client_template("n1"), usages)
    args = {"signer": CLIENT_SIGNER, "usages": usages, "name": name, "now": NOW}
    first = await obtain_certificate(api_for(fake), key, client_template("n1"), **args)
    again = await obtain_certificate(api_for(fake), key, client_template("n1"), **args)
    assert again == first and len(fake.created) == 1
    other = load_private_key(new_private_key())
    with pytest.raises(CertificateRequestError, match="is not ours: not signed by this node's key"):
        await obtain_certificate(api_for(fake), other, client_template("n1"), **args)


# --- start-up credentials ----------------------------------------------------------------


def kubeconfig(path: Path, ca: CA, user: dict[str, str], server: str = "https://api.test") -> Path:
    ca_pem = ca.cert.public_bytes(serialization.Encoding.PEM)
    path.write_text(
        json.dumps(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": server,
                            "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                        },
                    }
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def certificate_user(cert: bytes, key: bytes) -> dict[str, str]:
    return {
        "client-certificate-data": base64.b64encode(cert).decode(),
        "client-key-data": base64.b64encode(key).decode(),
    }


def options(tmp: Path, *flags: str) -> AgentOptions:
    return parse_run_options(
        [
            "--hostname-override=n1",
            f"--kubeconfig={tmp / 'kubelet.conf'}",
            f"--cert-dir={tmp / 'pki'}",
            *flags,
        ]
    )


def bootstrap(tmp: Path, ca: CA) -> str:
    kubeconfig(
        tmp / "bootstrap.conf",
        ca,
        {"token": "abcdef.0123456789abcdef"},
        server="https://bootstrap.test",
    )
    return f"--bootstrap-kubeconfig={tmp / 'bootstrap.conf'}"


def test_without_a_kubeconfig_the_node_bootstraps_anonymously(ca: CA, tmp_path: Path) -> None:
    credentials = client_credentials(options(tmp_path, bootstrap(tmp_path, ca)), NOW)
    assert credentials.current is None and credentials.bootstrap is not None
    assert credentials.bootstrap.token == "abcdef.0123456789abcdef"
    connection = credentials.connection
    assert connection.server == "https://bootstrap.test" and connection.token is None
    assert connection.client_certificate is None and connection.ca_data is not None


def test_a_kubeconfig_with_a_valid_certificate_wins_over_the_bootstrap(
    ca: CA, tmp_path: Path
) -> None:
    cert, key = ca.node_pair("n1")
    kubeconfig(tmp_path / "kubelet.conf", ca, certificate_user(cert, key))
    credentials = client_credentials(options(tmp_path, bootstrap(tmp_path, ca)), NOW)
    assert credentials.current is not None and credentials.current.certificate == cert
    assert credentials.connection.server == "https://api.test"


@pytest.mark.parametrize("user", ["expired", "token", "broken"])
def test_an_unusable_kubeconfig_means_a_bootstrap(
    ca: CA, tmp_path: Path, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    if user == "expired":
        entry = certificate_user(
            *ca.node_pair(
                "n1", not_before=NOW - datetime.timedelta(hours=3), life=datetime.timedelta(hours=1)
            )
        )
        kubeconfig(tmp_path / "kubelet.conf", ca, entry)
    elif user == "token":
        kubeconfig(tmp_path / "kubelet.conf", ca, {"token": "t"})
    else:
        (tmp_path / "kubelet.conf").write_text("users: [")
    with caplog.at_level(logging.INFO):
        credentials = client_credentials(options(tmp_path, bootstrap(tmp_path, ca)), NOW)
    assert credentials.current is None
    assert credentials.connection.server == "https://bootstrap.test"
    assert "TLS bootstrap" in caplog.text


def test_with_rotation_the_stores_pair_wins_and_a_kubeconfig_pair_is_stored(
    ca: CA, tmp_path: Path
) -> None:
    cert, key = ca.node_pair("n1")
    kubeconfig(tmp_path / "kubelet.conf", ca, certificate_user(cert, key))
    first = client_credentials(options(tmp_path, "--rotate-certificates"), NOW)
    store = CertificateStore("kubelet-client", tmp_path / "pki")
    assert first.current is not None and store.current() == first.current  # copied, as Go does
    renewed = store.update(*ca.node_pair("n1"), NOW + datetime.timedelta(seconds=2))
    second = client_credentials(options(tmp_path, "--rotate-certificates"), NOW)
    assert second.current == renewed
    assert second.connection.client_certificate == renewed.certificate


def test_a_missing_bootstrap_kubeconfig_is_named(tmp_path: Path) -> None:
    flag = f"--bootstrap-kubeconfig={tmp_path / 'nope.conf'}"
    with pytest.raises(KubeconfigError, match=r"^--bootstrap-kubeconfig .*nope.conf: No such file"):
        client_credentials(options(tmp_path, flag), NOW)


def test_without_bootstrap_a_missing_kubeconfig_is_still_an_error(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=r"^--kubeconfig .*kubelet.conf: No such file"):
        client_credentials(options(tmp_path, "--rotate-certificates"), NOW)


# --- the renewal loop ----------------------------------------------------------------------


async def test_renewals_come_at_the_jittered_deadline_and_failures_are_retried(
    ca: CA, autojump_clock: trio.testing.MockClock
) -> None:
    """A 100 s certificate (from 10 s ago) is renewed at 70-90 % of its life; a failed try is
    retried 2 s later; the renewed one is renewed in turn at its own deadline."""
    start = trio.current_time()
    epoch = NOW.timestamp()

    def clock() -> float:
        return epoch + (trio.current_time() - start)

    def pair(issued_at: float) -> KeyPair:
        cert, key = ca.node_pair(
            "n1",
            not_before=datetime.datetime.fromtimestamp(issued_at, datetime.UTC),
            life=datetime.timedelta(seconds=100),
        )
        return key_pair(cert, key)

    current = [pair(clock() - 10)]
    attempts: list[float] = []

    async def renew() -> KeyPair:
        attempts.append(trio.current_time() - start)
        if len(attempts) == 1:
            raise CertificateRequestError("the API server said no")
        current.append(pair(clock()))
        return current[-1]

    rng = random.Random(7)
    jitters = [random.Random(7).random()]
    with trio.move_on_after(200):
        await rotate_forever(
            lambda: current[-1],
            client_template("n1"),
            renew,
            "client certificate",
            clock=clock,
            rng=rng,
        )
    facts = current[0].facts  # certificates count whole seconds: from its own not_before
    deadline = facts.not_before + (facts.not_after - facts.not_before) * (0.7 + 0.2 * jitters[0])
    assert attempts[0] == pytest.approx(deadline.timestamp() - epoch, abs=0.01)
    assert 2.0 <= attempts[1] - attempts[0] <= 2.2  # the retry
    assert 70 <= attempts[2] - attempts[1] <= 90  # the next renewal, 70-90 % into the new life
    assert len(current) >= 3


# --- the serving certificate -------------------------------------------------------------


async def test_the_serving_certificate_is_requested_for_the_node_addresses_and_served(
    ca: CA, tmp_path: Path
) -> None:
    fake = CSRApi(ca)
    node = options(tmp_path, "--rotate-certificates")
    manager = ServingCertificateManager(
        node,
        api_for(fake),
        lambda: [("InternalIP", "10.0.0.7"), ("Hostname", "n1")],
        clock=lambda: NOW.timestamp(),
    )
    assert manager.context.context is None  # nothing to serve yet
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(manager.run)
            while manager.current is None:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    (sent,) = fake.created
    assert sent["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
    assert sent["spec"]["usages"] == ["digital signature", "server auth"]
    request = x509.load_pem_x509_csr(base64.b64decode(sent["spec"]["request"]))
    sans = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["n1"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert manager.context.context is not None
    assert (tmp_path / "pki" / "kubelet-server-current.pem").is_symlink()
    # A restart serves the stored pair at once.
    again = ServingCertificateManager(
        node, api_for(fake), lambda: [], clock=lambda: NOW.timestamp()
    )
    assert again.current == manager.current and again.context.context is not None

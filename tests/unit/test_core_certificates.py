"""core/certificates.py: templates, usages, when to renew, retries, the bootstrap CSR's name and
what a CSR's status says."""

from __future__ import annotations

import base64
import datetime

import pytest

from trio_kubelet.core.certificates import (
    CertificateFacts,
    CertificateTemplate,
    Issued,
    Refused,
    Waiting,
    bootstrap_csr_name,
    client_template,
    client_usages,
    csr_outcome,
    retry_delay,
    rotation_deadline,
    satisfies,
    serving_template,
    serving_usages,
    unexpired,
)

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
HOUR = datetime.timedelta(hours=1)


def facts(**changes: object) -> CertificateFacts:
    values: dict[str, object] = {
        "not_before": T0,
        "not_after": T0 + 100 * HOUR,
        "common_name": "system:node:n1",
        "organizations": ("system:nodes",),
    }
    values.update(changes)
    return CertificateFacts(**values)  # type: ignore[arg-type]


def test_client_template_is_the_node_identity() -> None:
    assert client_template("n1") == CertificateTemplate(
        common_name="system:node:n1", organizations=("system:nodes",)
    )


def test_usages_add_key_encipherment_only_for_rsa() -> None:
    assert client_usages(rsa_key=False) == ("digital signature", "client auth")
    assert client_usages(rsa_key=True) == ("digital signature", "key encipherment", "client auth")
    assert serving_usages(rsa_key=False) == ("digital signature", "server auth")
    assert serving_usages(rsa_key=True) == ("digital signature", "key encipherment", "server auth")


def test_serving_template_from_node_addresses() -> None:
    template = serving_template(
        "n1",
        [
            ("InternalIP", "10.0.0.9"),
            ("InternalIP", "10.0.0.10"),
            ("ExternalIP", "not-an-ip"),
            ("Hostname", "n1.example"),
            ("InternalDNS", "a.internal"),
            ("InternalIP", "10.0.0.9"),
            ("Hostname", ""),
        ],
    )
    assert template == CertificateTemplate(
        common_name="system:node:n1",
        dns_names=("a.internal", "n1.example"),
        ip_addresses=("10.0.0.10", "10.0.0.9"),  # sorted as text, as Go sorts them
    )


def test_serving_template_counts_an_ip_hostname_as_ip() -> None:
    template = serving_template("n1", [("Hostname", "192.168.1.5")])
    assert template is not None
    assert (template.dns_names, template.ip_addresses) == ((), ("192.168.1.5",))


def test_no_serving_template_without_an_ip() -> None:
    assert serving_template("n1", [("Hostname", "n1")]) is None


def test_satisfies_needs_cn_and_every_asked_san() -> None:
    template = CertificateTemplate("system:node:n1", dns_names=("n1",), ip_addresses=("::1",))
    held = facts(dns_names=("n1", "extra"), ip_addresses=("0:0::1", "10.0.0.1"))
    assert satisfies(held, template)
    assert not satisfies(facts(dns_names=("n1",)), template)  # the IP is missing
    assert not satisfies(held, CertificateTemplate("system:node:n2"))
    assert not satisfies(facts(organizations=()), client_template("n1"))


def test_unexpired_up_to_the_end() -> None:
    held = facts()
    assert unexpired(held, held.not_after)
    assert not unexpired(held, held.not_after + datetime.timedelta(seconds=1))


@pytest.mark.parametrize(("jitter", "hours"), [(0.0, 70), (0.5, 80), (0.999999, 90)])
def test_rotation_deadline_is_70_to_90_percent_of_the_life(jitter: float, hours: int) -> None:
    deadline = rotation_deadline(facts(), client_template("n1"), T0, jitter)
    assert abs(deadline - (T0 + hours * HOUR)) < datetime.timedelta(seconds=1)


def test_rotation_deadline_counts_from_not_before() -> None:
    # The cluster's signer backdates certificates by 5 minutes: the life starts there.
    held = facts(not_before=T0 - datetime.timedelta(minutes=5), not_after=T0 + 10 * HOUR)
    deadline = rotation_deadline(held, None, T0, 0.0)
    assert deadline == held.not_before + (held.not_after - held.not_before) * 0.7


def test_rotation_is_now_when_the_certificate_no_longer_fits() -> None:
    now = T0 + HOUR
    assert rotation_deadline(facts(), client_template("n2"), now, 0.5) == now


def test_retry_delay_doubles_to_32_seconds() -> None:
    assert [retry_delay(n, 0.0) for n in range(1, 8)] == [2, 4, 8, 16, 32, 32, 32]
    assert retry_delay(1, 0.999) == pytest.approx(2.2, abs=0.01)


# The name Go's digestedName gives (computed with Go 1.26 for this key, subject and usages).
PUBLIC_KEY_HEX = (
    "3059301306072a8648ce3d020106082a8648ce3d03010703420004fb50388f29498d0a93ad25ec4c34037b"
    "9d3cc3cca4787eb6fedabe2b3003eac89f7765ca9d6288e6ff734f5cd08f3a5921cf54b21bb398b50ac0d2577f"
    "a07472"
)
GO_NAME = "node-csr-Jh0F5w4bpM8TMJ5TECrd2maor5Xbvoy7NS8X5PJrD1Y"


def test_bootstrap_csr_name_matches_go() -> None:
    name = bootstrap_csr_name(
        bytes.fromhex(PUBLIC_KEY_HEX), client_template("n1"), client_usages(rsa_key=False)
    )
    assert name == GO_NAME


def test_bootstrap_csr_name_depends_on_every_field() -> None:
    key = bytes.fromhex(PUBLIC_KEY_HEX)
    usages = client_usages(rsa_key=False)
    names = {
        bootstrap_csr_name(key, client_template("n1"), usages),
        bootstrap_csr_name(key + b"x", client_template("n1"), usages),
        bootstrap_csr_name(key, client_template("n2"), usages),
        bootstrap_csr_name(key, client_template("n1"), usages[:1]),
        bootstrap_csr_name(key, CertificateTemplate("system:node:n1", organizations=()), usages),
    }
    assert len(names) == 5


def csr(uid: str = "u1", conditions: list[dict[str, str]] | None = None, cert: str = "") -> dict:
    status: dict[str, object] = {"conditions": conditions or []}
    if cert:
        status["certificate"] = cert
    return {"metadata": {"name": "node-csr-x", "uid": uid}, "status": status}


APPROVED = {"type": "Approved", "status": "True", "reason": "AutoApproved", "message": "ok"}
PEM = b"-----BEGIN CERTIFICATE-----\n...\n"


def test_csr_outcome_waits_until_approved_and_signed() -> None:
    assert csr_outcome(csr(), "u1") == Waiting(approved=False)
    assert csr_outcome(csr(conditions=[APPROVED]), "u1") == Waiting(approved=True)
    signed = csr(conditions=[APPROVED], cert=base64.b64encode(PEM).decode())
    assert csr_outcome(signed, "u1") == Issued(PEM)


def test_a_signed_but_unapproved_csr_is_not_issued() -> None:
    assert csr_outcome(csr(cert=base64.b64encode(PEM).decode()), "u1") == Waiting(approved=False)


def test_csr_outcome_refusals_say_why() -> None:
    denied = {"type": "Denied", "status": "True", "reason": "Nope", "message": "not you"}
    failed = {"type": "Failed", "status": "True", "reason": "SignerError", "message": "bad"}
    assert csr_outcome(csr(conditions=[denied]), "u1") == Refused(
        "certificate signing request is denied, reason: Nope, message: not you"
    )
    assert csr_outcome(csr(conditions=[APPROVED, failed]), "u1") == Refused(
        "certificate signing request failed, reason: SignerError, message: bad"
    )
    assert csr_outcome(csr(uid="u2"), "u1") == Refused("csr 'node-csr-x' changed UIDs")
    garbled = csr(conditions=[APPROVED], cert="%%%")
    assert csr_outcome(garbled, "u1") == Refused(
        "csr 'node-csr-x': status.certificate is not base64"
    )

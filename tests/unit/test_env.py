"""core.env: a container's environment, $(VAR) expansion and service links, as the Go kubelet."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_kubelet.core.env import (
    EnvError,
    container_env,
    expand,
    expand_command,
    service_env_vars,
)
from trio_kubelet.core.objects import (
    ClusterLookup,
    ObjectKind,
    ObjectUnavailable,
    ServiceLink,
    ServicePort,
)
from trio_kubelet.model.pod import Container, Pod

GiB = 1024**3
ALLOCATABLE = {"cpu": Fraction(4), "memory": Fraction(8 * GiB),
               "ephemeral-storage": Fraction(100 * GiB)}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Objects:
    """An ObjectLookup over a dict, counting reads; ``unavailable`` names raise."""

    def __init__(self, objects: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
                 unavailable: frozenset[str] = frozenset()) -> None:
        self.objects = dict(objects or {})
        self.unavailable = unavailable
        self.reads: list[tuple[str, str, str]] = []

    def __call__(self, kind: ObjectKind, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.reads.append((kind, namespace, name))
        if name in self.unavailable:
            raise ObjectUnavailable(f"{kind} {namespace}/{name} is not synced yet")
        return self.objects.get((kind, name))


class Services:
    """A ServiceLookup over a list; ``synced=False`` answers like a cache never listed."""

    def __init__(self, *services: ServiceLink, synced: bool = True) -> None:
        self.all = services
        self.synced = synced

    def services(self, namespace: str) -> list[ServiceLink]:
        if not self.synced:
            raise ObjectUnavailable("services have not yet been read at least once")
        return [service for service in self.all if service.namespace == namespace]


def config_map(name: str, data: dict[str, str], binary: dict[str, str] | None = None
               ) -> tuple[tuple[str, str], dict[str, Any]]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": "default"}, "data": data}
    if binary:
        obj["binaryData"] = binary
    return ("ConfigMap", name), obj


def secret(name: str, data: dict[str, str]) -> tuple[tuple[str, str], dict[str, Any]]:
    obj = {"metadata": {"name": name, "namespace": "default"},
           "data": {k: b64(v) for k, v in data.items()}}
    return ("Secret", name), obj


def make_pod(container: dict[str, Any] | None = None, **spec: Any) -> Pod:
    body: dict[str, Any] = {"name": "app", "image": "busybox"}
    body.update(container or {})
    return Pod.model_validate({
        "metadata": {"name": "web-0", "namespace": "default", "uid": "1234-abcd",
                     "labels": {"app": "web", "tier": "front"},
                     "annotations": {"example.com/owner": 'team "a"\n'}},
        "spec": {"containers": [body], "nodeName": "node-1",
                 "serviceAccountName": "builder", **spec},
    })


def env_of(pod: Pod, lookup: Objects | ClusterLookup | None = None,
           container: Container | None = None, **overrides: Any) -> list[tuple[str, str]]:
    args: dict[str, Any] = {
        "lookup": lookup or Objects(), "pod_ip": "10.1.0.5", "pod_ips": ["10.1.0.5"],
        "host_ip": "192.168.0.10", "host_ips": ["192.168.0.10"],
        "node_allocatable": ALLOCATABLE,
    }
    args.update(overrides)
    env: list[tuple[str, str]] = container_env(pod, container or pod.spec.containers[0], **args)
    return env


def env_dict(pod: Pod, lookup: Objects | ClusterLookup | None = None,
             **overrides: Any) -> dict[str, str]:
    return dict(env_of(pod, lookup, **overrides))


def with_env(*env: dict[str, Any], env_from: list[dict[str, Any]] | None = None,
             **container: Any) -> Pod:
    return make_pod({"env": list(env), "envFrom": env_from or [], **container})


def value_from(name: str, **source: Any) -> dict[str, Any]:
    return {"name": name, "valueFrom": source}


def field(name: str, path: str, **extra: Any) -> dict[str, Any]:
    return value_from(name, fieldRef={"fieldPath": path, **extra})


def resource(name: str, res: str, **extra: Any) -> dict[str, Any]:
    return value_from(name, resourceFieldRef={"resource": res, **extra})


# --- expand -------------------------------------------------------------------------------

CONTEXT = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}


@pytest.mark.parametrize("text, want", [
    ("$(VAR_A)", "A"),
    ("$(VAR_A)-$(VAR_A)", "A-A"),
    ("___$(VAR_B)___", "___B___"),
    ("$(VAR_A)_$(VAR_B)_$(VAR_C)", "A_B_C"),
    ("$$(VAR_B)_$(VAR_A)", "$(VAR_B)_A"),           # $$ escapes the operator
    ("$$(VAR_A)_$$(VAR_B)", "$(VAR_A)_$(VAR_B)"),
    ("f000-$$VAR_A", "f000-$VAR_A"),
    ("foo\\$(VAR_C)bar", "foo\\Cbar"),              # backslash is no escape
    ("$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"),       # the name runs to the first ')'
    ("$(VAR_A$(VAR_B)", "$(VAR_A$(VAR_B)"),
    ("$(VAR_REF)", "$(VAR_A)"),                     # values are not expanded again
    ("foo$(VAR_EMPTY)bar", "foobar"),
    ("foo$(VAR_Awhoops!", "foo$(VAR_Awhoops!"),     # unterminated reference stays
    ("f00__(VAR_A)__", "f00__(VAR_A)__"),
    ("$?_boo_$!", "$?_boo_$!"),
    ("$VAR_A", "$VAR_A"),
    ("${VAR_A}", "${VAR_A}"),
    ("$VAR_A)", "$VAR_A)"),
    ("$(VAR_DNE)", "$(VAR_DNE)"),                   # undefined references stay literal
    ("$()", "$()"),
    ("$$$$$$(BIG_MONEY)", "$$$(BIG_MONEY)"),
    ("$$$$$$(VAR_A)", "$$$(VAR_A)"),
    ("$$$$$$$(GOOD_ODDS)", "$$$$(GOOD_ODDS)"),
    ("$$$$$$$(VAR_A)", "$$$A"),
    ("$(VAR_B)_______$(A", "B_______$(A"),
    ("$(VAR_C)_______$(", "C_______$("),
    ("$(VAR_A)foobarzab$", "Afoobarzab$"),          # a trailing operator is kept
    ("--$($($($($--", "--$($($($($--"),
    ("foo0--$($($($(", "foo0--$($($($("),
    ("$(foo$$var)", "$(foo$$var)"),
    ("$a$(VAR_A)", "$aA"),
    ("\n", "\n"),
    ("", ""),
    ("$", "$"),
    ("héllo $(VAR_A) ünïcode", "héllo A ünïcode"),
])
def test_expand_matches_go(text: str, want: str) -> None:
    assert expand(text, CONTEXT) == want


names = st.text(st.characters(blacklist_characters=")"), max_size=12)
mappings = st.dictionaries(names, st.text(max_size=12), max_size=4)


@given(st.text(st.characters(blacklist_characters="$")), mappings)
def test_text_without_operator_is_unchanged(text: str, mapping: dict[str, str]) -> None:
    assert expand(text, mapping) == text


@given(st.text(), mappings)
def test_doubling_every_dollar_escapes_everything(text: str, mapping: dict[str, str]) -> None:
    assert expand(text.replace("$", "$$"), mapping) == text


@given(st.text(), names, st.text(), st.text())
def test_defined_reference_is_replaced_between_escaped_text(
    before: str, name: str, value: str, after: str
) -> None:
    text = before.replace("$", "$$") + f"$({name})" + after.replace("$", "$$")
    assert expand(text, {name: value}) == before + value + after


@given(names)
def test_undefined_reference_is_left_as_written(name: str) -> None:
    assert expand(f"$({name})", {}) == f"$({name})"


# --- expand_command -----------------------------------------------------------------------

def test_expand_command_uses_the_final_environment() -> None:
    container = Container.model_validate({
        "name": "app", "image": "busybox",
        "command": ["/bin/$(SHELL)", "-c"],
        "args": ["echo $(GREETING) $(MISSING) $$(GREETING)", "plain"],
    })
    env = [("SHELL", "ash"), ("GREETING", "hi"), ("SHELL", "sh")]  # the last one counts
    assert expand_command(container, env) == (
        ["/bin/sh", "-c"], ["echo hi $(MISSING) $(GREETING)", "plain"])


def test_expand_command_without_command_or_args() -> None:
    container = Container.model_validate({"name": "app", "image": "busybox"})
    assert expand_command(container, [("A", "1")]) == ([], [])


# --- env values and expansion -------------------------------------------------------------

def test_plain_values_in_declaration_order() -> None:
    pod = with_env({"name": "B", "value": "2"}, {"name": "A", "value": "1"})
    assert env_of(pod) == [("B", "2"), ("A", "1")]


def test_values_expand_against_earlier_variables_only() -> None:
    pod = with_env(
        {"name": "HOST", "value": "db"},
        {"name": "URL", "value": "pg://$(HOST):$(PORT)/$$(HOST)"},
        {"name": "PORT", "value": "5432"},
    )
    assert env_dict(pod)["URL"] == "pg://db:$(PORT)/$(HOST)"


def test_value_can_extend_an_env_from_variable() -> None:
    lookup = Objects(dict([config_map("cfg", {"PATH": "/usr/bin"})]))
    pod = with_env({"name": "PATH", "value": "$(PATH):/opt/bin"},
                   env_from=[{"configMapRef": {"name": "cfg"}}])
    assert env_of(pod, lookup) == [("PATH", "/usr/bin:/opt/bin")]


def test_empty_value_without_source_is_empty() -> None:
    assert env_of(with_env({"name": "EMPTY"}, {"name": "ALSO", "value": ""})) == [
        ("EMPTY", ""), ("ALSO", "")]


def test_non_empty_value_wins_over_value_from() -> None:
    pod = with_env({"name": "A", "value": "literal",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    assert env_of(pod) == [("A", "literal")]


def test_duplicate_names_keep_first_position_and_last_value() -> None:
    pod = with_env({"name": "A", "value": "1"}, {"name": "B", "value": "$(A)"},
                   {"name": "A", "value": "3"})
    assert env_of(pod) == [("A", "3"), ("B", "1")]


def test_unknown_value_from_source_is_empty() -> None:
    # fileKeyRef sits behind a feature gate that is off by default; Go then sets "".
    pod = with_env(value_from("F", fileKeyRef={"volumeName": "v", "path": "p", "key": "k"}))
    assert env_of(pod) == [("F", "")]


# --- service environment ------------------------------------------------------------------

def link(name: str, namespace: str, cluster_ip: str, *ports: ServicePort) -> ServiceLink:
    return ServiceLink(namespace, name, cluster_ip, ports or (ServicePort("", 80, "TCP"),))


MASTER_LINK = link("kubernetes", "default", "10.96.0.1", ServicePort("https", 443, "TCP"))
DB_LINK = link("db", "default", "10.96.0.9", ServicePort("", 5432, "TCP"))
SHOP_LINK = link("cart", "shop", "10.96.0.20", ServicePort("", 8080, "TCP"))


def with_services(*services: ServiceLink, synced: bool = True) -> ClusterLookup:
    return ClusterLookup(Objects(), Services(*services, synced=synced))


def shop_pod(**spec: Any) -> Pod:
    pod = make_pod(**spec)
    pod.metadata.namespace = "shop"
    return pod


def test_service_variables_come_last_sorted_and_are_not_duplicated() -> None:
    pod = with_env({"name": "DB_SERVICE_HOST", "value": "override"},
                   {"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST)"})
    env = env_of(pod, with_services(MASTER_LINK, DB_LINK))
    assert env[:2] == [("DB_SERVICE_HOST", "override"), ("API", "https://10.96.0.1")]
    names = [name for name, _ in env[2:]]
    assert names == sorted(names) and "DB_SERVICE_HOST" not in names
    assert ("KUBERNETES_SERVICE_HOST", "10.96.0.1") in env and ("DB_SERVICE_PORT", "5432") in env


def test_container_variables_shadow_service_variables_in_expansion() -> None:
    pod = with_env({"name": "KUBERNETES_SERVICE_HOST", "value": "mine"},
                   {"name": "X", "value": "$(KUBERNETES_SERVICE_HOST)"})
    assert env_dict(pod, with_services(MASTER_LINK))["X"] == "mine"


def test_env_from_overrides_service_variables_too() -> None:
    objects = Objects(dict([config_map("cfg", {"CART_SERVICE_HOST": "from-cfg"})]))
    pod = shop_pod(container={"envFrom": [{"configMapRef": {"name": "cfg"}}]})
    lookup = ClusterLookup(objects, Services(MASTER_LINK, SHOP_LINK))
    assert env_dict(pod, lookup)["CART_SERVICE_HOST"] == "from-cfg"


def test_service_links_of_the_pods_namespace_follow_enable_service_links() -> None:
    lookup = with_services(MASTER_LINK, DB_LINK, SHOP_LINK)
    linked = env_dict(shop_pod(), lookup)
    assert linked["CART_SERVICE_HOST"] == "10.96.0.20"
    assert linked["CART_PORT"] == "tcp://10.96.0.20:8080"
    assert linked["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    assert "DB_SERVICE_HOST" not in linked  # another namespace's service

    unlinked = env_dict(shop_pod(enableServiceLinks=False), lookup)
    assert {name.split("_")[0] for name in unlinked} == {"KUBERNETES"}
    assert unlinked["KUBERNETES_SERVICE_PORT"] == "443"


def test_service_host_expands_in_values_and_command() -> None:
    pod = shop_pod(container={
        "command": ["wget", "$(CART_URL)"],
        "env": [{"name": "CART_URL", "value": "http://$(CART_SERVICE_HOST):$(CART_SERVICE_PORT)"}],
    })
    env = env_of(pod, with_services(MASTER_LINK, SHOP_LINK))
    assert dict(env)["CART_URL"] == "http://10.96.0.20:8080"
    assert expand_command(pod.spec.containers[0], env)[0] == ["wget", "http://10.96.0.20:8080"]


def test_services_never_listed_fail_an_api_pod() -> None:
    pod = make_pod()
    pod.metadata.annotations["kubernetes.io/config.source"] = "api"
    with pytest.raises(EnvError, match="services have not yet been read") as caught:
        env_of(pod, with_services(MASTER_LINK, synced=False))
    assert caught.value.reason == "CreateContainerConfigError"
    # enableServiceLinks=false still needs the kubernetes service: the same error.
    with pytest.raises(EnvError, match="services have not yet been read"):
        env_of(make_pod(enableServiceLinks=False), with_services(synced=False))


def test_a_static_pod_does_not_wait_for_services() -> None:
    pod = make_pod()
    pod.metadata.annotations["kubernetes.io/config.source"] = "file"
    pod.spec.containers[0].env = []
    assert env_of(pod, with_services(MASTER_LINK, synced=False)) == []


def test_no_service_variables_without_a_service_lookup() -> None:
    # A plain ObjectLookup: no API server, no Services (static pods of a standalone node).
    assert not any("SERVICE" in name for name, _ in env_of(make_pod(), Objects()))


# --- envFrom ------------------------------------------------------------------------------

def test_env_from_config_map_and_secret_with_prefix_and_overrides() -> None:
    lookup = Objects(dict([
        config_map("cfg", {"b": "cfg-b", "a": "cfg-a", "SHARED": "from-cfg"},
                   binary={"blob": b64("bytes")}),
        secret("creds", {"user": "admin", "SHARED": "from-secret"}),
    ]))
    pod = with_env(
        {"name": "a", "value": "from-env"},
        env_from=[{"configMapRef": {"name": "cfg"}},
                  {"secretRef": {"name": "creds"}},
                  {"prefix": "CFG_", "configMapRef": {"name": "cfg"}}],
    )
    assert env_of(pod, lookup) == [
        ("SHARED", "from-secret"),   # a later source replaces an earlier one
        ("a", "from-env"),           # env replaces envFrom
        ("b", "cfg-b"),
        ("user", "admin"),
        ("CFG_SHARED", "from-cfg"),
        ("CFG_a", "cfg-a"),
        ("CFG_b", "cfg-b"),
    ]
    # One read per object, however often it is referenced.
    assert sorted(lookup.reads) == [("ConfigMap", "default", "cfg"),
                                    ("Secret", "default", "creds")]


def test_env_from_takes_every_key_whatever_its_form() -> None:
    """Go >= 1.34 (RelaxedEnvironmentVariableValidation GA) skips no key and reports nothing:
    keys that are not C identifiers (hyphens, dots, a leading digit) reach the container."""
    lookup = Objects(dict([
        config_map("cfg", {"data-1": "value-1", "1234": "abc", "dotted.name": "w"}),
        secret("s", {"data-1": "value-1\n"}),
    ]))
    pod = with_env(env_from=[{"configMapRef": {"name": "cfg"}},
                             {"prefix": "p-", "secretRef": {"name": "s"}},
                             {"prefix": "p_", "configMapRef": {"name": "cfg"}}])
    assert env_of(pod, lookup) == [
        ("1234", "abc"), ("data-1", "value-1"), ("dotted.name", "w"),
        ("p-data-1", "value-1\n"),
        ("p_1234", "abc"), ("p_data-1", "value-1"), ("p_dotted.name", "w"),
    ]


@pytest.mark.parametrize("ref, message", [
    ({"configMapRef": {"name": "cfg"}}, 'configmap "cfg" not found'),
    ({"secretRef": {"name": "creds"}}, 'secret "creds" not found'),
    ({"configMapRef": {"name": "cfg", "optional": False}}, 'configmap "cfg" not found'),
])
def test_env_from_missing_object(ref: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvError) as caught:
        env_of(with_env(env_from=[ref]))
    assert caught.value.message == message == str(caught.value)
    assert caught.value.reason == "CreateContainerConfigError"


def test_env_from_missing_optional_object_is_skipped() -> None:
    pod = with_env({"name": "A", "value": "1"},
                   env_from=[{"configMapRef": {"name": "cfg", "optional": True}},
                             {"secretRef": {"name": "s", "optional": True}}])
    assert env_of(pod) == [("A", "1")]


def test_unavailable_object_is_an_error_even_when_optional() -> None:
    lookup = Objects(unavailable=frozenset({"cfg"}))
    pod = with_env(env_from=[{"configMapRef": {"name": "cfg", "optional": True}}])
    with pytest.raises(EnvError, match="ConfigMap default/cfg is not synced yet"):
        env_of(pod, lookup)


def test_secret_that_is_not_base64_is_an_error() -> None:
    lookup = Objects({("Secret", "s"): {"metadata": {"name": "s"}, "data": {"k": "!!!"}}})
    with pytest.raises(EnvError, match="not valid base64"):
        env_of(with_env(env_from=[{"secretRef": {"name": "s"}}]), lookup)


# --- configMapKeyRef / secretKeyRef -------------------------------------------------------

KEYS = Objects(dict([config_map("cfg", {"FOO": "bar"}, binary={"BIN": b64("x")}),
                     secret("creds", {"password": "s3cr3t"})]))


def test_key_refs() -> None:
    pod = with_env(value_from("A", configMapKeyRef={"name": "cfg", "key": "FOO"}),
                   value_from("B", secretKeyRef={"name": "creds", "key": "password"}),
                   {"name": "C", "value": "$(A)-$(B)"})
    assert env_of(pod, KEYS) == [("A", "bar"), ("B", "s3cr3t"), ("C", "bar-s3cr3t")]


def test_key_ref_values_are_not_expanded() -> None:
    lookup = Objects(dict([config_map("cfg", {"K": "$(A)"})]))
    pod = with_env({"name": "A", "value": "1"},
                   value_from("B", configMapKeyRef={"name": "cfg", "key": "K"}))
    assert env_dict(pod, lookup)["B"] == "$(A)"


@pytest.mark.parametrize("source, message", [
    ({"configMapKeyRef": {"name": "cfg", "key": "NOPE"}},
     "couldn't find key NOPE in ConfigMap default/cfg"),
    ({"configMapKeyRef": {"name": "cfg", "key": "BIN"}},   # binaryData is not env
     "couldn't find key BIN in ConfigMap default/cfg"),
    ({"secretKeyRef": {"name": "creds", "key": "user"}},
     "couldn't find key user in Secret default/creds"),
    ({"configMapKeyRef": {"name": "other", "key": "FOO"}}, 'configmap "other" not found'),
    ({"secretKeyRef": {"name": "other", "key": "FOO"}}, 'secret "other" not found'),
])
def test_key_ref_errors(source: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvError) as caught:
        env_of(with_env(value_from("X", **source)), KEYS)
    assert caught.value.message == message


@pytest.mark.parametrize("source", [
    {"configMapKeyRef": {"name": "cfg", "key": "NOPE", "optional": True}},
    {"configMapKeyRef": {"name": "other", "key": "FOO", "optional": True}},
    {"secretKeyRef": {"name": "creds", "key": "user", "optional": True}},
    {"secretKeyRef": {"name": "other", "key": "FOO", "optional": True}},
])
def test_missing_optional_key_refs_are_left_out(source: dict[str, Any]) -> None:
    pod = with_env({"name": "X", "value": "before"}, value_from("X", **source))
    assert env_of(pod, KEYS) == [("X", "before")]


def test_unavailable_key_ref_object() -> None:
    lookup = Objects(unavailable=frozenset({"creds"}))
    pod = with_env(value_from("X", secretKeyRef={"name": "creds", "key": "k",
                                                 "optional": True}))
    with pytest.raises(EnvError, match="Secret default/creds is not synced yet"):
        env_of(pod, lookup)


# --- fieldRef -----------------------------------------------------------------------------

@pytest.mark.parametrize("path, want", [
    ("metadata.name", "web-0"),
    ("metadata.namespace", "default"),
    ("metadata.uid", "1234-abcd"),
    ("metadata.labels['app']", "web"),
    ("metadata.labels['missing']", ""),
    ("metadata.annotations['example.com/owner']", 'team "a"\n'),
    ("metadata.labels", 'app="web"\ntier="front"'),
    ("metadata.annotations", 'example.com/owner="team \\"a\\"\\n"'),
    ("spec.nodeName", "node-1"),
    ("spec.host", "node-1"),
    ("spec.serviceAccountName", "builder"),
    ("status.hostIP", "192.168.0.10"),
    ("status.hostIPs", "192.168.0.10"),
    ("status.podIP", "10.1.0.5"),
    ("status.podIPs", "10.1.0.5"),
])
def test_field_refs(path: str, want: str) -> None:
    assert env_of(with_env(field("V", path))) == [("V", want)]


def test_field_ref_explicit_api_version() -> None:
    assert env_of(with_env(field("V", "metadata.name", apiVersion="v1"))) == [("V", "web-0")]


def test_unset_spec_fields_are_empty() -> None:
    pod = Pod.model_validate({"spec": {"containers": [{
        "name": "app", "image": "busybox",
        "env": [field("N", "spec.nodeName"), field("S", "spec.serviceAccountName")]}]}})
    assert env_of(pod) == [("N", ""), ("S", "")]


def test_dual_stack_addresses_put_the_node_family_first() -> None:
    pod = with_env(field("IP", "status.podIP"), field("IPS", "status.podIPs"),
                   field("HOSTS", "status.hostIPs"))
    addresses: dict[str, Any] = {
        "pod_ip": "10.1.0.5", "pod_ips": ["10.1.0.5", "fd00::5", "10.1.0.6"],
        "host_ip": "fd00::1", "host_ips": ["fd00::1", "192.168.0.10"],
    }
    assert env_of(pod, **addresses) == [
        ("IP", "fd00::5"), ("IPS", "fd00::5,10.1.0.5"), ("HOSTS", "fd00::1,192.168.0.10")]
    ipv4_node = {**addresses, "host_ip": "192.168.0.10"}
    assert env_dict(pod, **ipv4_node)["IPS"] == "10.1.0.5,fd00::5"


def test_pod_ip_before_the_sandbox_has_addresses() -> None:
    pod = with_env(field("IP", "status.podIP"), field("IPS", "status.podIPs"))
    assert env_of(pod, pod_ip="", pod_ips=[]) == [("IP", ""), ("IPS", "")]
    assert env_of(pod, pod_ip="10.1.0.7", pod_ips=[]) == [("IP", "10.1.0.7"),
                                                          ("IPS", "10.1.0.7")]


def test_label_map_quotes_values_as_go_does() -> None:
    pod = Pod.model_validate({
        "metadata": {"name": "p", "labels": {"b": "2"},
                     "annotations": {"z": "tab\there\x01\x7f", "a": "ü€😀\u200b\\"}},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                 "env": [field("A", "metadata.annotations")]}]},
    })
    assert env_of(pod) == [("A", 'a="ü€😀\\u200b\\\\"\nz="tab\\there\\x01\\x7f"')]


@pytest.mark.parametrize("ref, message", [
    ({"fieldPath": "metadata.name", "apiVersion": "v2"}, "unsupported pod version: v2"),
    ({"fieldPath": "spec.containers"}, "field label not supported: spec.containers"),
    ({"fieldPath": "status.phase"}, "unsupported fieldPath: status.phase"),
    ({"fieldPath": "spec.restartPolicy"}, "unsupported fieldPath: spec.restartPolicy"),
    ({"fieldPath": "metadata.name['x']"},
     "field label does not support subscript: metadata.name['x']"),
    ({"fieldPath": "metadata.labels['bad key']"},
     "invalid key subscript in metadata.labels['bad key']"),
    ({"fieldPath": "metadata.labels['a/b/c']"},
     "invalid key subscript in metadata.labels['a/b/c']"),
    ({"fieldPath": "metadata.annotations['/x']"},
     "invalid key subscript in metadata.annotations['/x']"),
])
def test_field_ref_errors(ref: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvError) as caught:
        env_of(with_env(value_from("V", fieldRef=ref)))
    assert caught.value.message.startswith(message)


def test_annotation_subscript_is_validated_case_insensitively() -> None:
    pod = make_pod({"env": [field("V", "metadata.annotations['Example.COM/Owner']")]})
    assert env_of(pod) == [("V", "")]


# --- resourceFieldRef ---------------------------------------------------------------------

def resources_pod(*env: dict[str, Any], limits: dict[str, Any] | None = None,
                  requests: dict[str, Any] | None = None, **spec: Any) -> Pod:
    return make_pod({"env": list(env),
                     "resources": {"limits": limits or {}, "requests": requests or {}}}, **spec)


@pytest.mark.parametrize("env, want", [
    (resource("V", "limits.cpu"), "1"),                          # 500m rounds up to a core
    (resource("V", "limits.cpu", divisor="1m"), "500"),
    (resource("V", "limits.cpu", divisor="1"), "1"),
    (resource("V", "requests.cpu", divisor="1m"), "250"),
    (resource("V", "requests.cpu"), "1"),
    (resource("V", "limits.memory"), str(128 * 1024**2)),
    (resource("V", "limits.memory", divisor="1Mi"), "128"),
    (resource("V", "limits.memory", divisor="1M"), "135"),       # 134.2 MB, rounded up
    (resource("V", "requests.memory", divisor="1Mi"), "64"),
    (resource("V", "limits.ephemeral-storage", divisor="1Gi"), "2"),
    (resource("V", "requests.ephemeral-storage", divisor="1Gi"), "2"),  # request from limit
    (resource("V", "limits.hugepages-2Mi", divisor="1Mi"), "4"),
    (resource("V", "requests.hugepages-1Gi"), "0"),
    (resource("V", "limits.cpu", divisor=0), "1"),               # a zero divisor means 1
])
def test_resource_refs(env: dict[str, Any], want: str) -> None:
    pod = resources_pod(env, limits={"cpu": "500m", "memory": "128Mi",
                                     "ephemeral-storage": "1.5Gi", "hugepages-2Mi": "4Mi"},
                        requests={"cpu": "250m", "memory": "64Mi"})
    assert env_of(pod) == [("V", want)]


def test_cpu_rounds_each_step_up() -> None:
    pod = resources_pod(resource("M", "limits.cpu", divisor="1m"),
                        resource("C", "limits.cpu"), limits={"cpu": "1.0001"})
    assert env_of(pod) == [("M", "1001"), ("C", "2")]


def test_unset_or_zero_limits_default_to_node_allocatable() -> None:
    pod = resources_pod(resource("CPU", "limits.cpu", divisor="1m"),
                        resource("MEM", "limits.memory", divisor="1Gi"),
                        resource("DISK", "limits.ephemeral-storage", divisor="1Gi"),
                        resource("REQ", "requests.cpu"),
                        limits={"memory": "0"})
    assert env_of(pod) == [("CPU", "4000"), ("MEM", "8"), ("DISK", "100"), ("REQ", "0")]


def test_limits_without_allocatable_are_zero() -> None:
    pod = resources_pod(resource("CPU", "limits.cpu"))
    assert env_of(pod, node_allocatable={}) == [("CPU", "0")]


def test_resource_ref_to_another_container() -> None:
    pod = Pod.model_validate({"spec": {
        "initContainers": [{"name": "init", "image": "busybox"}],
        "containers": [
            {"name": "app", "image": "busybox", "env": [
                resource("SIDE", "limits.memory", containerName="side", divisor="1Mi"),
                resource("SIDE_CPU", "limits.cpu", containerName="side"),
                resource("INIT", "limits.cpu", containerName="init"),
                resource("SELF", "limits.cpu", containerName="app", divisor="1m")]},
            {"name": "side", "image": "busybox",
             "resources": {"limits": {"memory": "32Mi"}}},
        ]}})
    # Go defaults limits to allocatable only for regular containers found by name.
    assert env_of(pod) == [("SIDE", "32"), ("SIDE_CPU", "4"), ("INIT", "0"), ("SELF", "4000")]


def test_init_container_own_limits_default_to_allocatable() -> None:
    pod = Pod.model_validate({"spec": {
        "initContainers": [{"name": "init", "image": "busybox",
                            "env": [resource("CPU", "limits.cpu")]}],
        "containers": [{"name": "app", "image": "busybox"}]}})
    assert env_of(pod, container=pod.spec.init_containers[0]) == [("CPU", "4")]


@pytest.mark.parametrize("env, message", [
    (resource("V", "limits.gpu"), "unsupported container resource : limits.gpu"),
    (resource("V", "cpu"), "unsupported container resource : cpu"),
    (resource("V", "limits.cpu", containerName="ghost"), "container ghost not found"),
    (resource("V", "limits.cpu", divisor="lots"), "resourceFieldRef limits.cpu: divisor:"),
    (resource("V", "limits.cpu", divisor="-1"), "resourceFieldRef limits.cpu: divisor must"),
])
def test_resource_ref_errors(env: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvError) as caught:
        env_of(resources_pod(env))
    assert caught.value.message.startswith(message)


# --- service_env_vars ---------------------------------------------------------------------

def service(name: str, namespace: str, cluster_ip: str,
            ports: list[ServicePort] | None = None) -> ServiceLink:
    chosen = ports if ports is not None else [ServicePort("", 80, "TCP")]
    return ServiceLink(namespace, name, cluster_ip, tuple(chosen))


MASTER = service("kubernetes", "default", "10.96.0.1", [ServicePort("https", 443, "TCP")])


def test_service_links_for_one_service() -> None:
    svc = service("redis-primary", "shop", "10.0.0.11",
                  [ServicePort("", 6379, "TCP"), ServicePort("metrics-port", 9121, "UDP")])
    assert service_env_vars([svc], "shop", True) == {
        "REDIS_PRIMARY_SERVICE_HOST": "10.0.0.11",
        "REDIS_PRIMARY_SERVICE_PORT": "6379",
        "REDIS_PRIMARY_SERVICE_PORT_METRICS_PORT": "9121",
        "REDIS_PRIMARY_PORT": "tcp://10.0.0.11:6379",
        "REDIS_PRIMARY_PORT_6379_TCP": "tcp://10.0.0.11:6379",
        "REDIS_PRIMARY_PORT_6379_TCP_PROTO": "tcp",
        "REDIS_PRIMARY_PORT_6379_TCP_PORT": "6379",
        "REDIS_PRIMARY_PORT_6379_TCP_ADDR": "10.0.0.11",
        "REDIS_PRIMARY_PORT_9121_UDP": "udp://10.0.0.11:9121",
        "REDIS_PRIMARY_PORT_9121_UDP_PROTO": "udp",
        "REDIS_PRIMARY_PORT_9121_UDP_PORT": "9121",
        "REDIS_PRIMARY_PORT_9121_UDP_ADDR": "10.0.0.11",
    }


def test_master_service_is_always_included() -> None:
    services = [MASTER, service("web", "shop", "10.0.0.2"), service("other", "x", "10.0.0.3")]
    linked = service_env_vars(services, "shop", True)
    assert linked["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    assert linked["KUBERNETES_SERVICE_PORT_HTTPS"] == "443"
    assert linked["KUBERNETES_PORT"] == "tcp://10.96.0.1:443"
    assert linked["WEB_SERVICE_HOST"] == "10.0.0.2"
    assert not any(key.startswith("OTHER_") for key in linked)

    unlinked = service_env_vars(services, "shop", False)
    assert {key.split("_")[0] for key in unlinked} == {"KUBERNETES"}
    assert service_env_vars(services, "default", False) == unlinked


def test_services_without_cluster_ip_are_skipped() -> None:
    services = [service("headless", "shop", "None"), service("empty", "shop", ""),
                service("noports", "shop", "10.0.0.4", [])]
    assert service_env_vars(services, "shop", True) == {}


def test_local_kubernetes_service_shadows_the_master() -> None:
    local = service("kubernetes", "shop", "10.0.0.50")
    for services in ([MASTER, local], [local, MASTER]):
        assert service_env_vars(services, "shop", True)["KUBERNETES_SERVICE_HOST"] == "10.0.0.50"
    assert service_env_vars([local, MASTER], "shop", False)["KUBERNETES_SERVICE_HOST"] == (
        "10.96.0.1")


def test_ipv6_cluster_ip_is_bracketed_in_urls() -> None:
    linked = service_env_vars([service("api", "shop", "fd00::10", [ServicePort("", 8080, "TCP")])],
                              "shop", True)
    assert linked["API_PORT"] == "tcp://[fd00::10]:8080"
    assert linked["API_PORT_8080_TCP_ADDR"] == "fd00::10"
    assert linked["API_SERVICE_HOST"] == "fd00::10"


def test_service_env_feeds_container_env() -> None:
    links = service_env_vars([MASTER], "default", True)
    pod = with_env({"name": "URL", "value": "https://$(KUBERNETES_SERVICE_HOST):"
                                            "$(KUBERNETES_SERVICE_PORT)"})
    env = env_of(pod, with_services(MASTER))
    assert env[0] == ("URL", "https://10.96.0.1:443")
    assert [name for name, _ in env[1:]] == sorted(links)

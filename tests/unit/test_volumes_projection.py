"""volumes.projection: configMap, secret, downwardAPI and projected payloads, as Go builds them."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import pytest

from trio_kubelet.core.objects import ObjectKind, ObjectUnavailable
from trio_kubelet.model.pod import Pod
from trio_kubelet.volumes.errors import VolumeError
from trio_kubelet.volumes.plugins import Plugin
from trio_kubelet.volumes.projection import NO_TOKEN, Payload, clean_payload, volume_payload

NS = "team"
ALLOCATABLE = {"cpu": Fraction(4), "memory": Fraction(8 * 2**30)}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


OBJECTS: dict[tuple[ObjectKind, str], dict[str, Any]] = {
    ("ConfigMap", "app"): {
        "metadata": {"name": "app"},
        "data": {"app.conf": "port=80", "level": "debug"},
        "binaryData": {"logo.bin": b64(b"\x89PNG")},
    },
    ("Secret", "creds"): {"metadata": {"name": "creds"}, "data": {"password": b64(b"hunter2")}},
}


def lookup(kind: ObjectKind, namespace: str, name: str) -> Mapping[str, Any] | None:
    assert namespace == NS
    return OBJECTS.get((kind, name))


def unavailable(kind: ObjectKind, namespace: str, name: str) -> Mapping[str, Any] | None:
    raise ObjectUnavailable(f"cannot read {kind} {namespace}/{name}: not synced yet")


def make_pod(**spec: Any) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": "web",
                "namespace": NS,
                "uid": "uid-1",
                "labels": {"app": "web", "tier": "front"},
                "annotations": {"note": 'say "hi"\n'},
            },
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "image": "nginx:1",
                        "resources": {
                            "limits": {"cpu": "500m", "memory": "128Mi"},
                            "requests": {"cpu": "250m"},
                        },
                    },
                    {"name": "bare", "image": "nginx:1"},
                ],
                **spec,
            },
        }
    )


def payload(plugin: Plugin, source: dict[str, Any], pod: Pod | None = None,
            token: str | None = None) -> Payload:
    return volume_payload(plugin, source, pod or make_pod(), lookup,
                          node_allocatable=ALLOCATABLE, token=token)


def failure(plugin: Plugin, source: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(VolumeError) as caught:
        payload(plugin, source, **kwargs)
    assert caught.value.reason == "FailedMount"
    return caught.value.message


# -- configMap and secret ---------------------------------------------------------------------


def test_config_map_projects_every_key_with_the_default_mode() -> None:
    assert payload("configmap", {"name": "app"}) == {
        "app.conf": (b"port=80", 0o644),
        "level": (b"debug", 0o644),
        "logo.bin": (b"\x89PNG", 0o644),
    }


def test_items_choose_keys_paths_and_modes() -> None:
    source = {
        "name": "app",
        "defaultMode": 0o600,
        "items": [
            {"key": "app.conf", "path": "conf/app.conf", "mode": 0o400},
            {"key": "level", "path": "lvl"},
        ],
    }
    assert payload("configmap", source) == {
        "conf/app.conf": (b"port=80", 0o400),
        "lvl": (b"debug", 0o600),
    }


def test_missing_config_map_is_an_error_unless_optional() -> None:
    assert failure("configmap", {"name": "nope"}) == 'configmap "nope" not found'
    assert payload("configmap", {"name": "nope", "optional": True}) == {}


def test_missing_key_is_an_error_unless_optional() -> None:
    source: dict[str, Any] = {"name": "app", "items": [{"key": "gone", "path": "g"}]}
    assert failure("configmap", source) == "configmap references non-existent config key: gone"
    assert payload("configmap", {**source, "optional": True}) == {}


def test_secret_reads_secret_name_and_decodes() -> None:
    assert payload("secret", {"secretName": "creds"}) == {"password": (b"hunter2", 0o644)}
    assert failure("secret", {"secretName": "other"}) == 'secret "other" not found'
    source = {"secretName": "creds", "items": [{"key": "user", "path": "u"}]}
    assert failure("secret", source) == "secret references non-existent secret key: user"


def test_an_unavailable_object_fails_even_when_optional() -> None:
    with pytest.raises(VolumeError, match="not synced yet"):
        volume_payload("configmap", {"name": "app", "optional": True}, make_pod(), unavailable,
                       node_allocatable=ALLOCATABLE)


def test_modes_outside_0777_are_rejected() -> None:
    message = failure("configmap", {"name": "app", "defaultMode": 0o4755})
    assert message == "defaultMode: must be a number between 0 and 0777 (octal), both inclusive"


# -- paths ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/etc/passwd", "invalid path: must be relative path: /etc/passwd"),
        ("a/../../b", "invalid path: must not contain '..': a/../../b"),
        ("..data", "invalid path: must not start with '..': ..data"),
        ("./..data", "invalid path: must not start with '..': ./..data"),
        ("", 'invalid path: must not be empty: ""'),
    ],
)
def test_item_paths_must_stay_inside_the_volume(path: str, message: str) -> None:
    source = {"name": "app", "items": [{"key": "level", "path": path}]}
    assert failure("configmap", source) == message


def test_paths_are_cleaned() -> None:
    assert clean_payload({"a//b/./c": (b"", 0o644), "d/": (b"", 0o600)}) == {
        "a/b/c": (b"", 0o644),
        "d": (b"", 0o600),
    }


# -- downwardAPI ------------------------------------------------------------------------------


def field(path: str, field_path: str) -> dict[str, Any]:
    return {"path": path, "fieldRef": {"fieldPath": field_path}}


def resource(path: str, container: str, name: str, divisor: str | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"containerName": container, "resource": name}
    if divisor is not None:
        ref["divisor"] = divisor
    return {"path": path, "resourceFieldRef": ref}


def test_downward_api_metadata_fields() -> None:
    items = [
        field("name", "metadata.name"),
        field("ns", "metadata.namespace"),
        field("uid", "metadata.uid"),
        field("labels", "metadata.labels"),
        field("annotations", "metadata.annotations"),
        field("tier", "metadata.labels['tier']"),
        field("absent", "metadata.labels['absent']"),
        {**field("mode", "metadata.name"), "mode": 0o400},
    ]
    assert payload("downward-api", {"items": items}) == {
        "name": (b"web", 0o644),
        "ns": (b"team", 0o644),
        "uid": (b"uid-1", 0o644),
        "labels": (b'app="web"\ntier="front"', 0o644),
        "annotations": (b'note="say \\"hi\\"\\n"', 0o644),
        "tier": (b"front", 0o644),
        "absent": (b"", 0o644),
        "mode": (b"web", 0o400),
    }


def test_downward_api_reports_every_bad_item() -> None:
    items = [field("ip", "status.podIP"), field("x", "spec.nodeName['a']"),
             field("ok", "metadata.name")]
    assert failure("downward-api", {"items": items}) == (
        '[unsupported fieldPath: status.podIP, fieldPath "spec.nodeName[\'a\']" '
        "does not support subscript]"
    )


def test_resource_field_refs_round_up_in_divisor_units() -> None:
    items = [
        resource("cpu_limit", "app", "limits.cpu", "1m"),
        resource("cpu_request", "app", "requests.cpu"),
        resource("mem_limit", "app", "limits.memory", "1Mi"),
        resource("mem_request", "app", "requests.memory"),  # defaults to the limit
        resource("bare_cpu", "bare", "limits.cpu"),  # unset: node allocatable
        resource("bare_mem", "bare", "limits.memory", "1Gi"),
        resource("bare_req", "bare", "requests.memory"),
    ]
    files = payload("downward-api", {"items": items})
    assert {path: data for path, (data, _) in files.items()} == {
        "cpu_limit": b"500",
        "cpu_request": b"1",
        "mem_limit": b"128",
        "mem_request": str(128 * 2**20).encode(),
        "bare_cpu": b"4",
        "bare_mem": b"8",
        "bare_req": b"0",
    }


def test_resource_field_ref_errors() -> None:
    assert failure("downward-api", {"items": [resource("x", "ghost", "limits.cpu")]}) == (
        "container ghost not found"
    )
    assert failure("downward-api", {"items": [resource("x", "app", "limits.gpu")]}) == (
        "unsupported container resource : limits.gpu"
    )


# -- projected --------------------------------------------------------------------------------


def test_projected_merges_sources_with_its_default_mode() -> None:
    source = {
        "defaultMode": 0o440,
        "sources": [
            {"configMap": {"name": "app", "items": [{"key": "level", "path": "level"}]}},
            {"secret": {"name": "creds"}},
            {"downwardAPI": {"items": [field("name", "metadata.name")]}},
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
        ],
    }
    assert payload("projected", source, token="jwt") == {
        "level": (b"debug", 0o440),
        "password": (b"hunter2", 0o440),
        "name": (b"web", 0o440),
        "token": (b"jwt", 0o440),
    }


def test_projected_token_is_0600_with_an_fs_group() -> None:
    pod = make_pod(securityContext={"fsGroup": 2000})
    source = {"sources": [{"serviceAccountToken": {"path": "token"}}]}
    assert payload("projected", source, pod=pod, token="jwt") == {"token": (b"jwt", 0o600)}


def test_projected_reports_all_failing_sources() -> None:
    source = {
        "sources": [
            {"configMap": {"name": "nope"}},
            {"secret": {"name": "gone", "optional": True}},
            {"serviceAccountToken": {"path": "token"}},
            {"clusterTrustBundle": {"name": "x"}},
        ]
    }
    assert failure("projected", source) == (
        f'[configmap "nope" not found, {NO_TOKEN}, '
        "unsupported projected volume source: clusterTrustBundle]"
    )

"""Pod validation as the API server's: one case (at least) per rule, in the API's words."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from trio_kubelet.model import validation
from trio_kubelet.model.pod import Pod
from trio_kubelet.model.validation import RULES, FieldError, describe_field_errors, validate_pod

Doc = dict[str, Any]


def base() -> Doc:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"},
                     "annotations": {"example.com/owner": "team-a"}},
        "spec": {
            "containers": [{
                "name": "app", "image": "busybox:1.36",
                "ports": [{"name": "http", "containerPort": 80}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                              "limits": {"cpu": "1", "memory": "128Mi"}},
                "env": [{"name": "MODE", "value": "x"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "livenessProbe": {"httpGet": {"port": 80}},
                "readinessProbe": {"tcpSocket": {"port": "http"}},
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
        },
    }


def container(doc: Doc, kind: str = "containers") -> Doc:
    found: Doc = doc["spec"][kind][0]
    return found


def errors(change: Callable[[Doc], object]) -> list[str]:
    doc = base()
    change(doc)
    return [str(e) for e in validate_pod(Pod.model_validate(doc))]


LABEL_VALUE_REGEX = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
NAME_PART_REGEX = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


def add_ephemeral(doc: Doc, **fields: Any) -> None:
    doc["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox:1.36", **fields}]


CASES: list[tuple[Callable[..., Any], Callable[[Doc], object], list[str]]] = [
    # metadata.labels
    (validation.metadata_labels,
     lambda d: d["metadata"]["labels"].update(app="x" * 5000),
     ['metadata.labels: Invalid value: "' + "x" * 100 + '..." (5000 characters): '
      "must be no more than 63 characters"]),
    (validation.metadata_labels,
     lambda d: d["metadata"]["labels"].update(app="-bad-"),
     [f'metadata.labels: Invalid value: "-bad-": {LABEL_VALUE_REGEX}']),
    (validation.metadata_labels,
     lambda d: d["metadata"]["labels"].update({"a/b/c": "x", "/x": "y"}),
     ['metadata.labels: Invalid value: "a/b/c": a valid label key must consist of alphanumeric '
      "characters, '-', '_' or '.', and must start and end with an alphanumeric character "
      "(e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
      "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and "
      "'/' (e.g. 'example.com/MyName')",
      'metadata.labels: Invalid value: "/x": prefix part must be non-empty']),
    # metadata.annotations
    (validation.metadata_annotations,
     lambda d: d["metadata"]["annotations"].update(big="x" * 1_000_000),
     ["metadata.annotations: Too long: must have at most 262144 bytes"]),
    (validation.metadata_annotations,
     lambda d: d["metadata"]["annotations"].update({"a": "é" * 131_072}),  # 2 bytes each
     ["metadata.annotations: Too long: must have at most 262144 bytes"]),
    (validation.metadata_annotations,
     lambda d: d["metadata"]["annotations"].update({"bad key!": "x"}),
     [f'metadata.annotations: Invalid value: "bad key!": {NAME_PART_REGEX}']),
    # spec.nodeSelector
    (validation.node_selector,
     lambda d: d["spec"]["nodeSelector"].update(zone="a b"),
     [f'spec.nodeSelector: Invalid value: "a b": {LABEL_VALUE_REGEX}']),
    # resources
    (validation.container_resources,
     lambda d: container(d)["resources"]["limits"].update(cpu="-1"),
     ['spec.containers[0].resources.limits[cpu]: Invalid value: "-1": '
      "must be greater than or equal to 0",
      'spec.containers[0].resources.requests: Invalid value: "100m": '
      "must be less than or equal to cpu limit of -1"]),
    (validation.container_resources,
     lambda d: container(d)["resources"].update(limits={"memory": "-5Mi"}, requests={}),
     ['spec.containers[0].resources.limits[memory]: Invalid value: "-5Mi": '
      "must be greater than or equal to 0"]),
    (validation.container_resources,
     lambda d: container(d)["resources"]["requests"].update(memory="2Gi"),
     ['spec.containers[0].resources.requests: Invalid value: "2Gi": '
      "must be less than or equal to memory limit of 128Mi"]),
    (validation.container_resources,
     lambda d: container(d)["resources"].update(
         requests={"hugepages-2Mi": "2Mi", "example.com/gpu": "1"},
         limits={"hugepages-2Mi": "4Mi"}),
     ['spec.containers[0].resources.requests: Invalid value: "2Mi": '
      "must be equal to hugepages-2Mi limit of 4Mi",
      "spec.containers[0].resources.limits: Required value: "
      "Limit must be set for non overcommitable resources"]),
    # integer ranges
    (validation.integer_ranges,
     lambda d: d["spec"].update(terminationGracePeriodSeconds=2**80),
     ["spec.terminationGracePeriodSeconds: Invalid value: 1208925819614629174706176: "
      "must be between 0 and 9223372036854775807, inclusive"]),
    (validation.integer_ranges,
     lambda d: d["spec"].update(activeDeadlineSeconds=2**31),
     ["spec.activeDeadlineSeconds: Invalid value: 2147483648: "
      "must be between 1 and 2147483647, inclusive"]),
    (validation.integer_ranges,
     lambda d: container(d)["livenessProbe"].update(periodSeconds=2**31),
     ["spec.containers[0].livenessProbe.periodSeconds: Invalid value: 2147483648: "
      "must be between 0 and 2147483647, inclusive"]),
    (validation.integer_ranges,
     lambda d: container(d)["livenessProbe"].update(httpGet={"port": 70000}),
     ["spec.containers[0].livenessProbe.httpGet.port: Invalid value: 70000: "
      "must be between 1 and 65535, inclusive"]),
    (validation.integer_ranges,
     lambda d: d["spec"].update(securityContext={"runAsUser": 2**31}),
     ["spec.securityContext.runAsUser: Invalid value: 2147483648: "
      "must be between 0 and 2147483647, inclusive"]),
    (validation.integer_ranges,
     lambda d: d["metadata"].update(generation=-1),
     ["metadata.generation: Invalid value: -1: must be greater than or equal to 0"]),
    # port names
    (validation.port_names,
     lambda d: container(d)["ports"].append({"name": "http", "containerPort": 81}),
     ['spec.containers[0].ports[1].name: Duplicate value: "http"']),
    (validation.port_names,
     lambda d: container(d)["ports"][0].update(name="-http--x-1234567"),
     ['spec.containers[0].ports[0].name: Invalid value: "-http--x-1234567": '
      "must be no more than 15 characters",
      'spec.containers[0].ports[0].name: Invalid value: "-http--x-1234567": '
      "must not contain consecutive hyphens",
      'spec.containers[0].ports[0].name: Invalid value: "-http--x-1234567": '
      "must not begin or end with a hyphen"]),
    # volume names
    (validation.volume_names,
     lambda d: (d["spec"]["volumes"][0].update(name="Data"),
                container(d)["volumeMounts"][0].update(name="Data")),
     ['spec.volumes[0].name: Invalid value: "Data": a lowercase RFC 1123 label must consist of '
      "lower case alphanumeric characters or '-', and must start and end with an alphanumeric "
      "character (e.g. 'my-name',  or '123-abc', regex used for validation is "
      "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"]),
    # volume mounts
    (validation.volume_mounts,
     lambda d: add_ephemeral(d, volumeMounts=[{"name": "nope", "mountPath": "/x"}]),
     ['spec.ephemeralContainers[0].volumeMounts[0].name: Not found: "nope"']),
    (validation.volume_mounts,
     lambda d: container(d)["volumeMounts"].extend(
         [{"name": "data", "mountPath": "/data"}, {"name": "data", "mountPath": ""}]),
     ['spec.containers[0].volumeMounts[1].mountPath: Invalid value: "/data": must be unique',
      "spec.containers[0].volumeMounts[2].mountPath: Required value"]),
    # env names
    (validation.env_names,
     lambda d: container(d)["env"].extend([{"name": ""}, {"name": "A=B"}]),
     ["spec.containers[0].env[1].name: Required value",
      'spec.containers[0].env[2].name: Invalid value: "A=B": a valid environment variable '
      "name must consist only of printable ASCII characters other than '='"]),
    # probes
    (validation.probe_thresholds,
     lambda d: (container(d)["livenessProbe"].update(successThreshold=2),
                container(d)["readinessProbe"].update(terminationGracePeriodSeconds=5)),
     ["spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
      "spec.containers[0].readinessProbe.terminationGracePeriodSeconds: Invalid value: 5: "
      "must not be set for readinessProbes"]),
]


def test_a_valid_pod_passes_every_rule() -> None:
    assert errors(lambda d: None) == []
    assert errors(lambda d: d["metadata"]["annotations"].update(a="x" * 262_000)) == []


@pytest.mark.parametrize(("rule", "change", "expected"), CASES,
                         ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_rule(rule: Callable[..., Any], change: Callable[[Doc], object],
              expected: list[str]) -> None:
    doc = base()
    change(doc)
    wire = Pod.model_validate(copy.deepcopy(doc)).to_api()
    assert [str(e) for e in rule(wire)] == expected
    assert errors(change) == expected  # and no other rule objects


def test_every_rule_has_a_case() -> None:
    assert {rule for rule, _, _ in CASES} == set(RULES)


def test_field_errors_print_as_the_api_servers() -> None:
    found = [FieldError("spec.x", "Required value"),
             FieldError("spec.y", "Invalid value", 3, "must be 1"),
             FieldError("spec.z", "Duplicate value", "a")]
    assert describe_field_errors(found) == (
        'spec.x: Required value; spec.y: Invalid value: 3: must be 1; '
        'spec.z: Duplicate value: "a"')

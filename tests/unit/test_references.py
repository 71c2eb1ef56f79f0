"""core/references.py: the ConfigMaps and Secrets a pod references, from every field that can."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_kubelet.core.references import PodReferences, pod_references
from trio_kubelet.model.pod import Pod

JSON = dict[str, Any]
CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")


def make_pod(spec: JSON) -> Pod:
    return Pod.model_validate({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})


def test_every_reference_field_of_every_container_kind() -> None:
    def container(name: str, cm: str, secret: str) -> JSON:
        return {
            "name": name,
            "image": "busybox:1.36",
            "env": [
                {"name": "A", "valueFrom": {"configMapKeyRef": {"name": f"{cm}-env", "key": "k"}}},
                {"name": "B", "valueFrom": {"secretKeyRef": {"name": f"{secret}-env", "key": "k"}}},
                {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "D", "value": "not-a-reference"},
            ],
            "envFrom": [
                {"configMapRef": {"name": f"{cm}-from"}, "prefix": "X_"},
                {"secretRef": {"name": f"{secret}-from", "optional": True}},
            ],
        }

    pod = make_pod(
        {
            "initContainers": [container("init", "i-cm", "i-s")],
            "containers": [container("main", "m-cm", "m-s")],
            "ephemeralContainers": [container("debug", "e-cm", "e-s")],
            "imagePullSecrets": [{"name": "pull"}],
            "serviceAccountName": "not-a-reference",
            "volumes": [
                {"name": "v1", "configMap": {"name": "vol-cm", "defaultMode": 420}},
                {"name": "v2", "secret": {"secretName": "vol-s", "optional": True}},
                {
                    "name": "v3",
                    "projected": {
                        "sources": [
                            {"configMap": {"name": "proj-cm"}},
                            {"secret": {"name": "proj-s"}},
                            {"serviceAccountToken": {"path": "token"}},
                            {"downwardAPI": {"items": []}},
                        ]
                    },
                },
                {"name": "v4", "emptyDir": {}},
            ],
        }
    )
    assert pod_references(pod) == PodReferences(
        config_maps=frozenset(
            {"vol-cm", "proj-cm"}
            | {f"{p}-cm-{f}" for p in ("i", "m", "e") for f in ("env", "from")}
        ),
        secrets=frozenset(
            {"pull", "vol-s", "proj-s"}
            | {f"{p}-s-{f}" for p in ("i", "m", "e") for f in ("env", "from")}
        ),
    )


def test_malformed_or_empty_references_name_nothing() -> None:
    pod = make_pod(
        {
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "envFrom": [{"configMapRef": "flat"}, {"secretRef": {"name": ""}}, {}],
                }
            ],
            "imagePullSecrets": [None, "flat", {"name": 3}, {}, {"name": "ok"}],
            "volumes": [{"name": "v", "projected": {"sources": "flat"}}],
        }
    )
    assert pod_references(pod) == PodReferences(frozenset(), frozenset({"ok"}))


# -- property: every name put in a reference field is found, and nothing else --------------

NAMES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
# The fields a name of each kind can be placed in (container fields in any container kind).
CONFIG_MAP_SLOTS = ("volume", "projected", "env", "envFrom")
SECRET_SLOTS = ("volume", "projected", "env", "envFrom", "imagePullSecrets")


@st.composite
def referencing_pods(draw: st.DrawFn) -> tuple[Pod, set[str], set[str]]:
    """A pod with names in random reference fields, and decoys in look-alike fields."""
    containers = {
        kind: {"name": kind.lower()[:4], "image": "busybox:1.36", "env": [], "envFrom": []}
        for kind in CONTAINER_KINDS
    }
    spec: JSON = {"volumes": [], "imagePullSecrets": []}
    placed: dict[str, set[str]] = {"configMap": set(), "secret": set()}
    decoy = draw(NAMES)
    decoys = {
        "name": "DECOY",
        "value": decoy,
        "valueFrom": {"fieldRef": {"fieldPath": decoy}},
    }
    containers["containers"]["env"].append(decoys)
    for kind, slots in (("configMap", CONFIG_MAP_SLOTS), ("secret", SECRET_SLOTS)):
        for name, slot, container_kind in draw(
            st.lists(st.tuples(NAMES, st.sampled_from(slots), st.sampled_from(CONTAINER_KINDS)))
        ):
            placed[kind].add(name)
            key = {"name": decoy}  # a key named like a decoy must not count
            if slot == "volume":
                source = {"name": name} if kind == "configMap" else {"secretName": name}
                volume = {"name": f"v{len(spec['volumes'])}", kind: source}
                spec["volumes"].append(volume)
            elif slot == "projected":
                sources = [{kind: {"name": name}}, {"downwardAPI": {"items": [key]}}]
                spec["volumes"].append(
                    {"name": f"v{len(spec['volumes'])}", "projected": {"sources": sources}}
                )
            elif slot == "env":
                ref = {f"{kind}KeyRef": {"name": name, "key": decoy}}
                containers[container_kind]["env"].append({"name": "E", "valueFrom": ref})
            elif slot == "envFrom":
                containers[container_kind]["envFrom"].append({f"{kind}Ref": {"name": name}})
            else:
                spec["imagePullSecrets"].append({"name": name})
    for kind in CONTAINER_KINDS:
        spec[kind] = [containers[kind]]
    return make_pod(spec), placed["configMap"], placed["secret"]


@settings(max_examples=200, deadline=None)
@given(referencing_pods())
def test_every_placed_name_is_found_and_nothing_else(
    case: tuple[Pod, set[str], set[str]],
) -> None:
    pod, config_maps, secrets = case
    assert pod_references(pod) == PodReferences(frozenset(config_maps), frozenset(secrets))

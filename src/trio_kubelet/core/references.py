"""The ConfigMaps and Secrets a pod references: what the Node authorizer lets its node read.

The Go kubelet's ``VisitPodConfigmapNames``/``VisitPodSecretNames`` (pkg/api/v1/pod), limited
to the sources this agent will act on: configMap, secret and projected volumes, env
``valueFrom``, ``envFrom`` of every container kind, and ``imagePullSecrets``. All of them
name objects in the pod's own namespace. Optional references count: the object may appear
later, and the node may read it either way.

Most of these fields are untyped mappings in the model, so the pod's API form is read
defensively: anything that is not the expected shape names nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from trio_kubelet.model.pod import Pod

CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True, slots=True)
class PodReferences:
    config_maps: frozenset[str]
    secrets: frozenset[str]


def pod_references(pod: Pod) -> PodReferences:
    """The names of the ConfigMaps and Secrets (in the pod's namespace) that ``pod`` uses."""
    spec = pod.spec.to_api()
    config_maps: list[str] = []
    secrets = [_name(ref, "name") for ref in _dicts(spec.get("imagePullSecrets"))]
    for volume in _dicts(spec.get("volumes")):
        config_maps.append(_name(volume.get("configMap"), "name"))
        secrets.append(_name(volume.get("secret"), "secretName"))
        projected = volume.get("projected")
        sources = projected.get("sources") if isinstance(projected, Mapping) else None
        for source in _dicts(sources):
            config_maps.append(_name(source.get("configMap"), "name"))
            secrets.append(_name(source.get("secret"), "name"))
    for kind in CONTAINER_KINDS:
        for container in _dicts(spec.get(kind)):
            for env in _dicts(container.get("env")):
                value_from = env.get("valueFrom")
                if isinstance(value_from, Mapping):
                    config_maps.append(_name(value_from.get("configMapKeyRef"), "name"))
                    secrets.append(_name(value_from.get("secretKeyRef"), "name"))
            for env_from in _dicts(container.get("envFrom")):
                config_maps.append(_name(env_from.get("configMapRef"), "name"))
                secrets.append(_name(env_from.get("secretRef"), "name"))
    # An absent reference reads as "": it names nothing.
    return PodReferences(frozenset(config_maps) - {""}, frozenset(secrets) - {""})


def image_pull_secret_names(pod: Pod) -> list[str]:
    """The pod's imagePullSecrets in order, without duplicates or empty names.

    The order matters: credentials of the first secret are tried first.
    """
    spec = pod.spec.to_api()
    names = (_name(ref, "name") for ref in _dicts(spec.get("imagePullSecrets")))
    return list(dict.fromkeys(name for name in names if name))


def _dicts(value: object) -> Iterator[Mapping[str, Any]]:
    """The mappings in a list field (a missing or malformed field yields none)."""
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, Mapping))


def _name(ref: object, key: str) -> str:
    """``ref[key]`` when ``ref`` is a mapping holding a string there, else ``""``."""
    if isinstance(ref, Mapping):
        name = ref.get(key)
        if isinstance(name, str):
            return name
    return ""

"""How pure decisions read the ConfigMaps and Secrets a pod refers to, and the cluster's Services.

Env vars and volumes take an ``ObjectLookup``: a function from (kind, namespace,
name) to the object's JSON, ``None`` when the object does not exist, or
``ObjectUnavailable`` when nobody can say yet (not synced, forbidden, no API
server). The shell passes one backed by the object caches; tests pass a dict.

A lookup that is also a :class:`ServiceLookup` (a :class:`ClusterLookup`) lists Services
for the link variables of containers' environments. A plain one gives none: without an
API server there are no Services to link.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

ObjectKind = Literal["ConfigMap", "Secret"]
ObjectLookup = Callable[[ObjectKind, str, str], Mapping[str, Any] | None]


class ObjectUnavailable(Exception):
    """The object cannot be read now; the message says why (and is shown to the user)."""


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    port: int
    protocol: str


@dataclass(frozen=True, slots=True)
class ServiceLink:
    """The little of a Service that link variables use; caches keep only this, per Service."""

    namespace: str
    name: str
    cluster_ip: str
    ports: tuple[ServicePort, ...]


@runtime_checkable
class ServiceLookup(Protocol):
    def services(self, namespace: str) -> Collection[ServiceLink]:
        """The namespace's Services; ``ObjectUnavailable`` while they have never been listed."""
        ...


@dataclass(frozen=True, slots=True)
class ClusterLookup:
    """An ``ObjectLookup`` that also lists Services: what pods read with an API server."""

    objects: ObjectLookup
    service_lookup: ServiceLookup

    def __call__(self, kind: ObjectKind, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.objects(kind, namespace, name)

    def services(self, namespace: str) -> Collection[ServiceLink]:
        return self.service_lookup.services(namespace)


def object_data(kind: ObjectKind, obj: Mapping[str, Any]) -> dict[str, bytes]:
    """Every key of a ConfigMap (``data`` and ``binaryData``) or Secret (``data``) as bytes."""
    found: dict[str, bytes] = {}
    if kind == "ConfigMap":
        for key, value in (obj.get("data") or {}).items():
            found[key] = str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            found[key] = _decode(kind, obj, key, value)
    else:
        for key, value in (obj.get("data") or {}).items():
            found[key] = _decode(kind, obj, key, value)
    return found


def _decode(kind: ObjectKind, obj: Mapping[str, Any], key: str, value: object) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        name = (obj.get("metadata") or {}).get("name", "?")
        raise ObjectUnavailable(f"{kind} {name!r}: key {key!r} is not valid base64") from None


def no_objects(kind: ObjectKind, namespace: str, name: str) -> Mapping[str, Any] | None:
    """The lookup without an API server: static pods cannot read cluster objects."""
    raise ObjectUnavailable(f"cannot read {kind} {namespace}/{name}: no API server configured")

"""Registry credentials from a pod's imagePullSecrets, matched to an image like the Go keyring.

A pull secret is a ``kubernetes.io/dockerconfigjson`` Secret (key ``.dockerconfigjson``,
``{"auths": {registry: entry}}``) or a legacy ``kubernetes.io/dockercfg`` one (key
``.dockercfg``, the entries without the ``auths`` wrapper). Each entry is keyed by a
registry, optionally with a path (``registry.local:5000/team``) and ``*`` globs in the
host's labels (``*.registry.local``). An image's credentials are those of every key that
matches its normalised repository — same number of host labels, each matching its glob,
same port, key path a prefix of the image's path — the most specific key first (keys are
tried in reverse lexical order). With no match, an image of Docker Hub gets the credentials
stored under ``index.docker.io``. The puller tries each in turn until one works.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any
from urllib.parse import urlsplit

from trio_kubelet.core.image_ref import DEFAULT_DOMAIN, LEGACY_DEFAULT_DOMAIN
from trio_kubelet.core.objects import ObjectLookup, ObjectUnavailable, object_data
from trio_kubelet.core.references import image_pull_secret_names
from trio_kubelet.model.pod import Pod

DOCKER_CONFIG_JSON_TYPE = "kubernetes.io/dockerconfigjson"
DOCKER_CONFIG_JSON_KEY = ".dockerconfigjson"
DOCKERCFG_TYPE = "kubernetes.io/dockercfg"
DOCKERCFG_KEY = ".dockercfg"


class DockerConfigError(ValueError):
    """A pull secret's docker config cannot be read; the message names the secret."""


@dataclass(frozen=True, slots=True)
class RegistryAuth:
    """One set of credentials for a registry; ``key`` is the config entry it came from."""

    key: str
    username: str = ""
    password: str = ""

    def __repr__(self) -> str:  # never print a password into a log
        return f"RegistryAuth(key={self.key!r}, username={self.username!r})"


@dataclass(frozen=True, slots=True)
class Keyring:
    """Credentials by registry key, in lookup order (most specific key first)."""

    entries: tuple[tuple[str, tuple[RegistryAuth, ...]], ...] = ()

    @classmethod
    def from_configs(cls, configs: Iterable[Mapping[str, RegistryAuth | Sequence[RegistryAuth]]]
                     ) -> Keyring:
        merged: dict[str, list[RegistryAuth]] = {}
        for config in configs:
            for key, auths in config.items():
                many = [auths] if isinstance(auths, RegistryAuth) else list(auths)
                merged.setdefault(key, []).extend(many)
        ordered = sorted(merged, reverse=True)
        return cls(tuple((key, tuple(merged[key])) for key in ordered))

    def lookup(self, repository: str) -> list[RegistryAuth]:
        """Credentials to try for ``repository`` (normalised, e.g. ``docker.io/library/x``)."""
        found = [
            auth for key, auths in self.entries if _key_matches(key, repository) for auth in auths
        ]
        if found or not _is_docker_hub(repository):
            return found
        for key, auths in self.entries:
            if key == LEGACY_DEFAULT_DOMAIN:
                return list(auths)
        return []


def registry_key(location: str) -> str:
    """The keyring key of a docker config entry: host plus path, no scheme, no /v1/ or /v2/."""
    url = location if location.startswith(("http://", "https://")) else f"https://{location}"
    parts = urlsplit(url)
    path = parts.path
    if path.startswith(("/v1/", "/v2/")):
        path = path[3:]
    return parts.netloc + path if path not in ("", "/") else parts.netloc


def parse_docker_config(data: bytes, *, wrapped: bool, where: str) -> dict[str, RegistryAuth]:
    """The entries of a ``.dockerconfigjson`` (``wrapped``: under ``auths``) or ``.dockercfg``."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise DockerConfigError(f"{where}: not valid JSON: {err}") from None
    if wrapped:
        document = document.get("auths", {}) if isinstance(document, dict) else None
    if not isinstance(document, dict):
        raise DockerConfigError(f"{where}: expected a JSON object of registries")
    entries: dict[str, RegistryAuth] = {}
    for location, entry in document.items():
        if not isinstance(entry, dict):
            raise DockerConfigError(f"{where}: entry {location!r} is not a JSON object")
        key = registry_key(location)
        entries[key] = _entry(key, entry, f"{where}: entry {location!r}")
    return entries


def _entry(key: str, entry: Mapping[str, Any], where: str) -> RegistryAuth:
    username = str(entry.get("username") or "")
    password = str(entry.get("password") or "")
    encoded = entry.get("auth")
    if encoded:
        # "auth" is base64("user:password") and wins over the separate fields.
        try:
            decoded = base64.b64decode(str(encoded), validate=True).decode()
        except (binascii.Error, ValueError):
            raise DockerConfigError(f"{where}: auth is not valid base64") from None
        username, colon, password = decoded.partition(":")
        if not colon:
            raise DockerConfigError(
                f"{where}: auth must be formatted as base64(username:password)"
            )
    return RegistryAuth(key=key, username=username, password=password)


def secret_docker_config(secret: Mapping[str, Any], where: str) -> dict[str, RegistryAuth]:
    """The docker config a pull Secret holds; an empty one for any other kind of Secret."""
    kind = secret.get("type")
    data = object_data("Secret", secret)
    if kind == DOCKER_CONFIG_JSON_TYPE and data.get(DOCKER_CONFIG_JSON_KEY):
        return parse_docker_config(data[DOCKER_CONFIG_JSON_KEY], wrapped=True, where=where)
    if kind == DOCKERCFG_TYPE and data.get(DOCKERCFG_KEY):
        return parse_docker_config(data[DOCKERCFG_KEY], wrapped=False, where=where)
    return {}


@dataclass(frozen=True, slots=True)
class PodKeyring:
    """A pod's keyring and the pull secrets it could not read (a Warning event says which)."""

    keyring: Keyring
    unreadable: tuple[str, ...] = ()


def pod_keyring(pod: Pod, objects: ObjectLookup) -> PodKeyring:
    """Read the pod's imagePullSecrets; secrets that are missing or unreadable are skipped.

    Raises DockerConfigError when a secret exists but its docker config is malformed:
    pulling without the credentials it was meant to give would only mislead.
    """
    namespace = pod.metadata.namespace
    configs: list[dict[str, RegistryAuth]] = []
    unreadable: list[str] = []
    for name in image_pull_secret_names(pod):
        try:
            secret = objects("Secret", namespace, name)
        except ObjectUnavailable:
            secret = None
        if secret is None:
            unreadable.append(name)
            continue
        try:
            configs.append(secret_docker_config(secret, f"secret {namespace}/{name}"))
        except ObjectUnavailable as err:  # data that is not base64
            raise DockerConfigError(str(err)) from None
    return PodKeyring(Keyring.from_configs(configs), tuple(unreadable))


def _split_host(netloc: str) -> tuple[list[str], str]:
    """A host's dot-separated labels and its port ("" without one); ``[IPv6]`` hosts too."""
    host, port = netloc, ""
    colon = netloc.rfind(":")
    if colon > netloc.rfind("]"):
        host, port = netloc[:colon], netloc[colon + 1 :]
    return host.strip("[]").split("."), port


def _key_matches(key: str, repository: str) -> bool:
    key_host, _, key_path = key.partition("/")
    image_host, _, image_path = repository.partition("/")
    key_labels, key_port = _split_host(key_host)
    image_labels, image_port = _split_host(image_host)
    if key_port != image_port or len(key_labels) != len(image_labels):
        return False
    if not all(fnmatchcase(label, glob) for glob, label in zip(key_labels, image_labels,
                                                               strict=True)):
        return False
    return f"/{image_path}".startswith(f"/{key_path}") if key_path else True


def _is_docker_hub(repository: str) -> bool:
    host = repository.partition("/")[0]
    return host in (DEFAULT_DOMAIN, LEGACY_DEFAULT_DOMAIN)

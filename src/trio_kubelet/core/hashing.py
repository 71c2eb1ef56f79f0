"""The container hash: a digest of one container's spec that tells a running container is stale.

The hash is stored on every container the agent creates (``labels.CONTAINER_HASH``)
and compared with the spec on each sync; a mismatch restarts that container.

Unlike the Go kubelet (v1.31+ hashes only name and image, because API pod specs are
immutable), this hashes the container's whole spec as the API serialises it. Static
pods here keep a stable UID across manifest edits, so the hash is what applies an
edit: changing any field of one container restarts that container and no other.
The price: adding a defaulted field to ``model.pod.Container`` changes every hash, so
an agent upgrade that does so restarts every container once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import weakref

from trio_kubelet.model.pod import Container

# id(container) -> (weak reference, hash). Pods are treated as immutable once parsed,
# so a container's hash is computed once; the weak reference lets the entry go with
# the container and guards against a recycled id() ever returning a stale hash.
_CACHE: dict[int, tuple[weakref.ref[Container], str]] = {}


def _digest(container: Container) -> str:
    canonical = json.dumps(container.to_api(), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def container_hash(container: Container) -> str:
    """A stable 16-hex-digit hash of the container's API serialisation (cached per instance)."""
    key = id(container)
    cached = _CACHE.get(key)
    if cached is not None and cached[0]() is container:
        return cached[1]
    value = _digest(container)
    _CACHE[key] = (weakref.ref(container, functools.partial(_forget, key)), value)
    return value


def _forget(key: int, ref: weakref.ref[Container]) -> None:
    entry = _CACHE.get(key)
    if entry is not None and entry[0] is ref:
        del _CACHE[key]

"""Container IDs as pod status shows them: ``<runtime>://<id>``, e.g. ``containerd://abc``.

The status form names the runtime; the CRI, log paths and probes want the bare id. Building and
stripping live here so that every reader agrees on what the prefix is.
"""

from __future__ import annotations

__all__ = ["runtime_id", "status_container_id"]

_SEPARATOR = "://"


def status_container_id(runtime_name: str, container_id: str) -> str:
    """The ``containerID`` of a container status: the runtime's name, ``://``, its id."""
    return f"{runtime_name}{_SEPARATOR}{container_id}"


def runtime_id(container_id: str | None) -> str:
    """The runtime's own id in a status ``containerID`` (``containerd://<id>`` -> ``<id>``).

    A value without the prefix is taken to be a bare id already and returned unchanged;
    None or empty gives "".
    """
    value = container_id or ""
    return value.partition(_SEPARATOR)[2] or value

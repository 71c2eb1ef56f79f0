"""Every Service of the cluster, as containers' link variables need them (Go's service informer).

One list+watch of ``/api/v1/services`` over all namespaces (the Node authorizer lets nodes
read Services). A cluster may have thousands, so each is kept only as a small
:class:`ServiceLink` (name, cluster IP, ports), and lists are read in pages so a relist never
holds every Service's full JSON at once. Headless and ExternalName Services (no cluster IP)
give no variables and are not kept.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection, Mapping
from typing import Any

import trio

from trio_kubelet.apiserver.client import JSON, APIClient, WatchEvent
from trio_kubelet.apiserver.reflector import Reflector
from trio_kubelet.core.objects import ObjectUnavailable, ServiceLink, ServicePort

log = logging.getLogger("trio_kubelet.apiserver")

PATH = "/api/v1/services"
PAGE_SIZE = 500  # client-go's pager default
# The wording the Go kubelet puts in the container's CreateContainerConfigError.
NOT_SYNCED = "services have not yet been read at least once, cannot construct envvars"

Links = dict[str, dict[str, ServiceLink]]  # namespace → name → link


class ServiceCache:
    """The Services by namespace; ``services`` answers from memory (a ``ServiceLookup``).

    Also the Reflector's handler: ``replace`` and ``apply`` take the API's JSON.
    """

    def __init__(self, client: APIClient) -> None:
        self.client = client
        self._links: Links = {}
        self._synced = trio.Event()

    @property
    def synced(self) -> bool:
        """Whether a first list has answered (afterwards the last state seen is served)."""
        return self._synced.is_set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """List and watch until cancelled; started at once, the first list may come later."""
        task_status.started()
        await _PagedReflector(self.client, self).run()

    def services(self, namespace: str) -> Collection[ServiceLink]:
        if not self.synced:
            raise ObjectUnavailable(NOT_SYNCED)
        return tuple(self._links.get(namespace, {}).values())

    async def wait_synced(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first list; whether it has answered."""
        with trio.move_on_after(timeout):
            await self._synced.wait()
        return self.synced

    async def replace(self, items: list[JSON]) -> None:
        links: Links = {}
        for item in items:
            _add(links, item)
        self.reset(links)

    def reset(self, links: Links) -> None:
        """Take a complete, already reduced collection (the paged list's result)."""
        self._links = links
        self._synced.set()

    async def apply(self, event: WatchEvent) -> None:
        meta = _mapping(event.object.get("metadata"))
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        self._links.get(namespace, {}).pop(name, None)
        if event.type != "DELETED":
            # A Service that lost its cluster IP (now ExternalName) is dropped here too.
            _add(self._links, event.object)
        if namespace in self._links and not self._links[namespace]:
            del self._links[namespace]


class _PagedReflector(Reflector):
    """Lists in pages of ``PAGE_SIZE``, reducing each page before reading the next."""

    def __init__(self, client: APIClient, cache: ServiceCache) -> None:
        super().__init__(client, PATH, cache, what="services")
        self.cache = cache

    async def list_all(self) -> None:
        links: Links = {}
        token = ""
        while True:
            params = {"limit": str(PAGE_SIZE), **({"continue": token} if token else {})}
            # An expired continue token is a Gone: the Reflector lists again from the start.
            answer = await self.client.get(self.path, params)
            for item in answer.get("items") or []:
                _add(links, _mapping(item))
            meta = _mapping(answer.get("metadata"))
            token = str(meta.get("continue") or "")
            if not token:
                break
        self.resource_version = str(meta.get("resourceVersion", ""))
        self.cache.reset(links)
        if not self.listed.is_set():
            count = sum(map(len, links.values()))
            log.info("Listed services: %d with a cluster IP", count)
        self.listed.set()


def _add(links: Links, service: Mapping[str, Any]) -> None:
    link = service_link(service)
    if link is not None:
        links.setdefault(link.namespace, {})[link.name] = link


def service_link(service: Mapping[str, Any]) -> ServiceLink | None:
    """The Service's link, or None when it has no cluster IP (nothing to link to)."""
    meta, spec = _mapping(service.get("metadata")), _mapping(service.get("spec"))
    cluster_ip = str(spec.get("clusterIP") or "")
    if cluster_ip in ("", "None"):
        return None
    ports = tuple(
        ServicePort(
            name=str(port.get("name") or ""),
            port=port["port"],
            # Interned: thousands of Services share a handful of protocol names.
            protocol=sys.intern(str(port.get("protocol") or "TCP")),
        )
        for port in map(_mapping, spec.get("ports") or [])
        if isinstance(port.get("port"), int)  # the API validates it; a bad one is not linked
    )
    return ServiceLink(
        namespace=sys.intern(str(meta.get("namespace", ""))),
        name=str(meta.get("name", "")),
        cluster_ip=cluster_ip,
        ports=ports,
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}

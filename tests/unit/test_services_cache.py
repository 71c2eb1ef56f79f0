"""apiserver/services.py against an in-memory API server (httpx.MockTransport) on MockClock.

The fake serves ``/api/v1/services`` across namespaces: paged lists (``limit``/``continue``),
watches that stream changes, and can expire a watch (410 Gone) to force a relist.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import Connection
from trio_kubelet.apiserver.object_cache import ObjectCache, PodObjects
from trio_kubelet.apiserver.services import NOT_SYNCED, ServiceCache
from trio_kubelet.core.env import EnvError, container_env
from trio_kubelet.core.objects import ObjectUnavailable, ServiceLink, ServicePort
from trio_kubelet.model.pod import Pod

JSON = dict[str, Any]
Key = tuple[str, str]  # namespace, name


class FakeAPI:
    def __init__(self) -> None:
        self.services: dict[Key, JSON] = {}
        self.version = 100
        self.lists = 0  # list requests (pages)
        self.relists = 0  # first pages, i.e. complete lists started
        self.listing = trio.Event()  # set once a list was asked for (the API "answers" then)
        self.hold_lists = False
        self.watchers: list[trio.MemorySendChannel[bytes]] = []

    def put(self, namespace: str, name: str, cluster_ip: str, *ports: JSON) -> None:
        self.version += 1
        meta = {
            "name": name,
            "namespace": namespace,
            "resourceVersion": str(self.version),
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        }
        spec = {"clusterIP": cluster_ip, "ports": list(ports) or [{"port": 80}]}
        obj = {"metadata": meta, "spec": spec, "status": {"loadBalancer": {}}}
        kind = "MODIFIED" if (namespace, name) in self.services else "ADDED"
        self.services[namespace, name] = obj
        self._send({"type": kind, "object": obj})

    def remove(self, namespace: str, name: str) -> None:
        self.version += 1
        obj = self.services.pop((namespace, name))
        obj["metadata"]["resourceVersion"] = str(self.version)
        self._send({"type": "DELETED", "object": obj})

    def expire_watches(self) -> None:
        """The watch's resourceVersion is too old: an ERROR 410 event, as etcd compaction gives."""
        status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
        self._send({"type": "ERROR", "object": status})

    def _send(self, frame: JSON) -> None:
        line = json.dumps(frame).encode() + b"\n"
        for channel in self.watchers:
            channel.send_nowait(line)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/services"
        params = request.url.params
        if "watch" in params:
            return httpx.Response(200, content=self._stream())
        self.listing.set()
        while self.hold_lists:
            await trio.sleep(0.1)
        self.lists += 1
        ordered = sorted(self.services)
        start = int(params.get("continue") or 0)
        if start == 0:
            self.relists += 1
        limit = int(params.get("limit") or len(ordered) or 1)
        page = ordered[start : start + limit]
        meta: JSON = {"resourceVersion": str(self.version)}
        if start + limit < len(ordered):
            meta["continue"] = str(start + limit)
        items = [self.services[key] for key in page]
        return httpx.Response(200, json={"metadata": meta, "items": items})

    async def _stream(self) -> AsyncIterator[bytes]:
        send, receive = trio.open_memory_channel[bytes](100)
        self.watchers.append(send)
        try:
            async for line in receive:
                yield line
                if b'"ERROR"' in line:
                    return
        finally:
            self.watchers.remove(send)


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI()


def client(api: FakeAPI) -> APIClient:
    connection = Connection(server="http://api.test", ssl_context=None, token=None)
    return APIClient(connection, transport=httpx.MockTransport(api.handle))


def names(cache: ServiceCache, namespace: str) -> dict[str, str]:
    return {link.name: link.cluster_ip for link in cache.services(namespace)}


async def settle() -> None:
    """Let the cache's tasks and the fake's streams run to quiescence (a virtual second)."""
    await trio.sleep(1)


async def test_lists_every_namespace_in_pages_keeping_only_link_fields(
    autojump_clock: trio.testing.MockClock, api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("trio_kubelet.apiserver.services.PAGE_SIZE", 2)
    api.put("default", "kubernetes", "10.96.0.1", {"name": "https", "port": 443})
    api.put("shop", "cart", "10.96.0.20", {"port": 8080, "protocol": "UDP"})
    api.put("shop", "db", "10.96.0.21")
    api.put("shop", "headless", "None")
    api.put("tools", "ci", "10.96.0.30")
    cache = ServiceCache(client(api))
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        assert await cache.wait_synced(5)
        assert api.lists == 3 and api.relists == 1  # 5 services in pages of 2
        assert names(cache, "shop") == {"cart": "10.96.0.20", "db": "10.96.0.21"}
        assert names(cache, "tools") == {"ci": "10.96.0.30"}
        assert names(cache, "empty") == {}
        (master,) = cache.services("default")
        assert master == ServiceLink(
            "default", "kubernetes", "10.96.0.1", (ServicePort("https", 443, "TCP"),)
        )
        nursery.cancel_scope.cancel()


async def test_watch_events_add_modify_and_delete(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("shop", "cart", "10.96.0.20")
    cache = ServiceCache(client(api))
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        await cache.wait_synced(5)
        await settle()
        api.put("shop", "db", "10.96.0.21")  # ADDED
        api.put("shop", "cart", "10.96.0.20", {"port": 9090})  # MODIFIED
        await settle()
        assert names(cache, "shop") == {"cart": "10.96.0.20", "db": "10.96.0.21"}
        (cart,) = [link for link in cache.services("shop") if link.name == "cart"]
        assert cart.ports == (ServicePort("", 9090, "TCP"),)

        api.remove("shop", "db")  # DELETED
        api.put("shop", "cart", "")  # became ExternalName: no cluster IP, nothing to link
        await settle()
        assert names(cache, "shop") == {}
        assert api.relists == 1  # all through the one watch
        nursery.cancel_scope.cancel()


async def test_an_expired_watch_relists_and_replaces_everything(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("shop", "cart", "10.96.0.20")
    api.put("shop", "db", "10.96.0.21")
    cache = ServiceCache(client(api))
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        await cache.wait_synced(5)
        await settle()
        # Changes the watch misses (the fake only streams to open watches).
        watchers, api.watchers = api.watchers, []
        api.remove("shop", "db")
        api.put("tools", "ci", "10.96.0.30")
        api.watchers = watchers
        api.expire_watches()
        await settle()
        assert api.relists == 2
        assert names(cache, "shop") == {"cart": "10.96.0.20"}
        assert names(cache, "tools") == {"ci": "10.96.0.30"}
        nursery.cancel_scope.cancel()


async def test_not_synced_until_the_first_list_answers(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.hold_lists = True
    cache = ServiceCache(client(api))
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        await api.listing.wait()
        assert not cache.synced
        with pytest.raises(ObjectUnavailable, match=NOT_SYNCED):
            cache.services("default")
        assert not await cache.wait_synced(2)
        api.hold_lists = False
        assert await cache.wait_synced(5)
        assert cache.services("default") == ()
        nursery.cancel_scope.cancel()


def pod(source: str) -> Pod:
    return Pod.model_validate(
        {
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": "u1",
                "annotations": {"kubernetes.io/config.source": source},
            },
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        }
    )


async def test_pod_objects_lookup_gives_containers_the_service_links(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("default", "kubernetes", "10.96.0.1", {"name": "https", "port": 443})
    api.put("shop", "cart", "10.96.0.20", {"port": 8080})
    api.hold_lists = True
    http = client(api)
    services = ServiceCache(http)
    objects = PodObjects(ObjectCache(http, "configmaps"), ObjectCache(http, "secrets"), services)
    web = pod("api")

    def env() -> dict[str, str]:
        container = web.spec.containers[0]
        return dict(
            container_env(
                web,
                container,
                lookup=objects.lookup,
                pod_ip="10.1.0.5",
                pod_ips=["10.1.0.5"],
                host_ip="",
                host_ips=[],
                node_allocatable={},
            )
        )

    async with trio.open_nursery() as nursery:
        await nursery.start(services.run)
        start = trio.current_time()
        await objects.wait_for_services(web, timeout=2)  # gives up: the list does not answer
        assert trio.current_time() - start == pytest.approx(2)
        with pytest.raises(EnvError, match="services have not yet been read"):
            env()
        await objects.wait_for_services(pod("file"), timeout=2)  # static pods never wait
        assert trio.current_time() - start == pytest.approx(2)

        api.hold_lists = False
        await objects.wait_for_services(web, timeout=5)
        linked = env()
        assert linked["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
        assert linked["CART_SERVICE_HOST"] == "10.96.0.20"
        assert linked["CART_SERVICE_PORT"] == "8080"
        nursery.cancel_scope.cancel()

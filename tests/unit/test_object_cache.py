"""apiserver/object_cache.py against an in-memory API server (httpx.MockTransport) on MockClock.

The fake serves single-object lists and watches (``fieldSelector=metadata.name=``) of
ConfigMaps and Secrets, streams changes to open watches, and can deny objects with a 403 as
the Node authorizer does.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from trio_kubelet.apiserver import errors
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import Connection
from trio_kubelet.apiserver.object_cache import NotRegistered, NotSynced, ObjectCache
from trio_kubelet.model.pod import Pod

JSON = dict[str, Any]
Key = tuple[str, str, str]  # resource, namespace, name


class FakeAPI:
    def __init__(self) -> None:
        self.objects: dict[Key, JSON] = {}
        self.version = 100
        self.denied: Counter[Key] = Counter()  # key → how many more requests get a 403
        self.unreachable: Counter[Key] = Counter()
        self.lists: Counter[Key] = Counter()
        self.watching: Counter[Key] = Counter()  # open watches
        self.watchers: dict[Key, list[trio.MemorySendChannel[bytes]]] = {}

    def put(self, resource: str, namespace: str, name: str, data: JSON) -> None:
        self.version += 1
        meta = {"name": name, "namespace": namespace, "resourceVersion": str(self.version)}
        obj = {"metadata": meta, "data": data}
        key = (resource, namespace, name)
        kind = "MODIFIED" if key in self.objects else "ADDED"
        self.objects[key] = obj
        self._send(key, kind, obj)

    def remove(self, resource: str, namespace: str, name: str) -> None:
        self.version += 1
        obj = self.objects.pop((resource, namespace, name))
        obj["metadata"]["resourceVersion"] = str(self.version)
        self._send((resource, namespace, name), "DELETED", obj)

    def _send(self, key: Key, kind: str, obj: JSON) -> None:
        line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
        for channel in self.watchers.get(key, []):
            channel.send_nowait(line)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        *_, namespace, resource = request.url.path.split("/")
        selector = request.url.params["fieldSelector"]
        assert selector.startswith("metadata.name=")
        key = (resource, namespace, selector.removeprefix("metadata.name="))
        if self.unreachable[key]:
            self.unreachable[key] -= 1
            raise httpx.ConnectError("refused")
        if self.denied[key]:
            self.denied[key] -= 1
            message = f'{resource} "{key[2]}" is forbidden: no relationship found'
            return httpx.Response(
                403, json={"kind": "Status", "reason": "Forbidden", "message": message}
            )
        if "watch" not in request.url.params:
            self.lists[key] += 1
            items = [self.objects[key]] if key in self.objects else []
            return httpx.Response(
                200, json={"metadata": {"resourceVersion": str(self.version)}, "items": items}
            )
        return httpx.Response(200, content=self._stream(key))

    async def _stream(self, key: Key) -> AsyncIterator[bytes]:
        send, receive = trio.open_memory_channel[bytes](100)
        self.watchers.setdefault(key, []).append(send)
        self.watching[key] += 1
        try:
            async for line in receive:
                yield line
        finally:
            self.watching[key] -= 1
            self.watchers[key].remove(send)


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI()


def client(api: FakeAPI) -> APIClient:
    connection = Connection(server="http://api.test", ssl_context=None, token=None)
    return APIClient(connection, transport=httpx.MockTransport(api.handle))


def pod(uid: str, config_maps: Sequence[str] = (), secrets: Sequence[str] = ()) -> Pod:
    env = [
        {"name": f"E{i}", "valueFrom": {"configMapKeyRef": {"name": name, "key": "k"}}}
        for i, name in enumerate(config_maps)
    ]
    return Pod.model_validate(
        {
            "metadata": {"name": f"pod-{uid}", "namespace": "ns", "uid": uid},
            "spec": {
                "containers": [{"name": "main", "image": "busybox:1.36", "env": env}],
                "imagePullSecrets": [{"name": name} for name in secrets],
            },
        }
    )


async def answered(
    cache: ObjectCache, namespace: str, names: Sequence[str], timeout: float
) -> None:
    """Wait, woken as a pod worker is, until each named object had its first answer."""
    with trio.fail_after(timeout):
        while True:
            woken = trio.Event()
            if not cache.unanswered(namespace, names, woken.set):
                return
            await woken.wait()


async def settle() -> None:
    """Let the cache's tasks and the fake's streams run to quiescence (a virtual second)."""
    await trio.sleep(1)


async def test_one_watch_per_object_counted_by_pods_and_stopped_with_the_last(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("configmaps", "ns", "shared", {"k": "1"})
    api.put("configmaps", "ns", "own", {"k": "2"})
    cache = ObjectCache(client(api), "configmaps")
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", ["shared", "own"]))
        cache.register_pod(pod("b", ["shared"]))
        await answered(cache, "ns", ["shared", "own"], timeout=5)
        await settle()
        assert cache.get("ns", "shared")["data"] == {"k": "1"}
        assert cache.get("ns", "own")["data"] == {"k": "2"}
        shared, own = ("configmaps", "ns", "shared"), ("configmaps", "ns", "own")
        assert api.lists[shared] == 1 and api.watching[shared] == 1

        cache.unregister_pod("a")
        await settle()
        assert api.watching[own] == 0 and api.watching[shared] == 1
        with pytest.raises(NotRegistered, match="configmaps ns/own"):
            cache.get("ns", "own")
        assert cache.get("ns", "shared")["data"] == {"k": "1"}

        cache.unregister_pod("b")
        cache.unregister_pod("b")  # twice, or never registered: nothing to drop
        await settle()
        assert api.watching[shared] == 0
        with pytest.raises(NotRegistered):
            cache.get("ns", "shared")
        nursery.cancel_scope.cancel()


async def test_a_new_version_of_a_pod_swaps_its_references_keeping_shared_watches(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    cache = ObjectCache(client(api), "configmaps")
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", ["kept", "dropped"]))
        await settle()
        cache.register_pod(pod("a", ["kept", "added"]))
        await settle()
        assert api.watching[("configmaps", "ns", "dropped")] == 0
        assert api.watching[("configmaps", "ns", "added")] == 1
        assert api.lists[("configmaps", "ns", "kept")] == 1  # never restarted
        cache.register_pod(pod("a"))  # no references left
        await settle()
        assert sum(api.watching.values()) == 0
        nursery.cancel_scope.cancel()


async def test_updates_deletions_and_recreations_are_seen(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("configmaps", "ns", "cfg", {"v": "1"})
    cache = ObjectCache(client(api), "configmaps")
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", ["cfg"]))
        await answered(cache, "ns", ["cfg"], timeout=5)
        await settle()
        api.put("configmaps", "ns", "cfg", {"v": "2"})
        await settle()
        assert cache.get("ns", "cfg")["data"] == {"v": "2"}
        api.remove("configmaps", "ns", "cfg")
        await settle()
        with pytest.raises(errors.NotFound, match='configmaps "cfg" not found'):
            cache.get("ns", "cfg")
        api.put("configmaps", "ns", "cfg", {"v": "3"})
        await settle()
        assert cache.get("ns", "cfg")["data"] == {"v": "3"}
        assert api.lists[("configmaps", "ns", "cfg")] == 1  # all through the one watch
        nursery.cancel_scope.cancel()


async def test_not_found_is_an_answer_remembered_until_the_object_appears(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    cache = ObjectCache(client(api), "secrets")
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", secrets=["pull"]))
        await answered(cache, "ns", ["pull"], timeout=5)
        for _ in range(3):
            with pytest.raises(errors.NotFound) as caught:
                cache.get("ns", "pull")
            assert caught.value.status == 404
        assert api.lists[("secrets", "ns", "pull")] == 1  # asked once, then remembered
        api.put("secrets", "ns", "pull", {".dockerconfigjson": "e30="})
        await settle()
        assert cache.get("ns", "pull")["data"] == {".dockerconfigjson": "e30="}
        nursery.cancel_scope.cancel()


async def test_forbidden_is_surfaced_precisely_after_a_short_grace(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("configmaps", "ns", "other", {"v": "1"})
    key = ("configmaps", "ns", "other")
    api.denied[key] = 10**6
    cache = ObjectCache(client(api), "configmaps")
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", ["other"]))
        start = trio.current_time()
        with pytest.raises(NotSynced):
            cache.get("ns", "other")
        await answered(cache, "ns", ["other"], timeout=30)
        assert 3 <= trio.current_time() - start < 4  # the grace for the authorizer's lag
        with pytest.raises(errors.Forbidden) as caught:
            cache.get("ns", "other")
        assert caught.value.status == 403 and "no relationship found" in caught.value.message
        # Denials are asked again only after the Reflector's long wait, not in a hot loop.
        asked = 10**6 - api.denied[key]
        await trio.sleep(20)
        assert 10**6 - api.denied[key] == asked
        api.denied[key] = 0  # access granted: the next list clears the error
        await trio.sleep(60)
        assert cache.get("ns", "other")["data"] == {"v": "1"}
        nursery.cancel_scope.cancel()


async def test_a_denial_within_the_grace_is_not_an_answer(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("configmaps", "ns", "cfg", {"v": "1"})
    api.denied[("configmaps", "ns", "cfg")] = 2  # the authorizer has not seen the pod yet
    cache = ObjectCache(client(api), "configmaps")
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", ["cfg"]))
        await answered(cache, "ns", ["cfg"], timeout=5)
        assert cache.get("ns", "cfg")["data"] == {"v": "1"}
        nursery.cancel_scope.cancel()


async def test_an_unreachable_server_is_the_answer_until_a_list_succeeds(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("configmaps", "ns", "cfg", {"v": "1"})
    api.unreachable[("configmaps", "ns", "cfg")] = 1
    cache = ObjectCache(client(api), "configmaps")
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", ["cfg"]))
        await answered(cache, "ns", ["cfg"], timeout=5)
        with pytest.raises(errors.Unreachable):
            cache.get("ns", "cfg")
        await trio.sleep(5)  # the Reflector's backoff
        assert cache.get("ns", "cfg")["data"] == {"v": "1"}
        nursery.cancel_scope.cancel()


async def test_unanswered_names_the_objects_still_listing_and_wakes_on_the_answer(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("configmaps", "ns", "a", {"v": "1"})  # "b" does not exist: also an answer
    cache = ObjectCache(client(api), "configmaps")
    wakes: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("p", ["b", "a"]))
        waiting = cache.unanswered("ns", ["b", "a", "unknown"], lambda: wakes.append("p"))
        # Sorted; a name no pod references is not waited for (get says why).
        assert waiting == ["configmaps ns/a", "configmaps ns/b"]
        assert wakes == []
        await settle()
        assert wakes == ["p", "p"]  # once per object's first answer
        assert cache.unanswered("ns", ["a", "b"], lambda: wakes.append("late")) == []
        api.put("configmaps", "ns", "a", {"v": "2"})
        await settle()
        assert wakes == ["p", "p"]  # later changes wake nobody
        nursery.cancel_scope.cancel()


async def test_a_silent_server_leaves_the_objects_unanswered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def silent(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError  # unreachable: sleep_forever only ends by cancellation

    connection = Connection(server="http://api.test", ssl_context=None, token=None)
    cache = ObjectCache(APIClient(connection, transport=httpx.MockTransport(silent)), "configmaps")
    woken = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        cache.register_pod(pod("a", ["b", "a"]))
        assert cache.unanswered("ns", ["a", "b"], woken.set) == [
            "configmaps ns/a", "configmaps ns/b"]
        await trio.sleep(60)
        assert not woken.is_set()
        with pytest.raises(NotSynced, match="configmaps ns/a: not listed yet"):
            cache.get("ns", "a")
        nursery.cancel_scope.cancel()


async def test_pods_registered_before_run_are_watched_when_it_starts(
    autojump_clock: trio.testing.MockClock, api: FakeAPI
) -> None:
    api.put("secrets", "ns", "s", {"k": "dg=="})
    cache = ObjectCache(client(api), "secrets")
    cache.register_pod(pod("a", ["a-config-map-is-not-a-secret"], secrets=["s"]))
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        await answered(cache, "ns", ["s"], timeout=5)
        assert cache.get("ns", "s")["data"] == {"k": "dg=="}
        with pytest.raises(NotRegistered):
            cache.get("ns", "a-config-map-is-not-a-secret")
        nursery.cancel_scope.cancel()

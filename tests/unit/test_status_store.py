"""status.store: the latest status of every pod, and waking readers only on a real change."""

from __future__ import annotations

import trio
import trio.testing

from trio_kubelet.model.pod import Pod, PodStatus
from trio_kubelet.status.store import PodStatusStore


def make_pod(name: str, namespace: str = "default", *, uid: str | None = None,
             image: str = "busybox:1.36", labels: dict[str, str] | None = None) -> Pod:
    return Pod.model_validate({
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
                     "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": image}]},
    })


RUNNING = PodStatus(phase="Running", pod_ip="10.88.0.2")
PENDING = PodStatus(phase="Pending")


class Watcher:
    """Counts how often ``wait_changed`` returns, waiting again each time."""

    def __init__(self, store: PodStatusStore) -> None:
        self.store = store
        self.wakeups = 0

    async def run(self) -> None:
        while True:
            await self.store.wait_changed()
            self.wakeups += 1


async def watching(store: PodStatusStore, nursery: trio.Nursery) -> Watcher:
    watcher = Watcher(store)
    nursery.start_soon(watcher.run)
    await trio.testing.wait_all_tasks_blocked()
    return watcher


def test_set_records_the_status_on_a_copy_of_the_pod() -> None:
    store = PodStatusStore()
    pod = make_pod("web")
    store.set(pod, RUNNING)
    stored = store.get(pod.metadata.uid)
    assert stored is not None
    assert stored.status == RUNNING
    assert stored.spec == pod.spec and stored.metadata == pod.metadata
    assert pod.status == PodStatus(), "the caller's pod is not modified"
    assert store.get("no-such-uid") is None


def test_set_replaces_the_previous_status() -> None:
    store = PodStatusStore()
    pod = make_pod("web")
    store.set(pod, PENDING)
    store.set(pod, RUNNING)
    stored = store.get(pod.metadata.uid)
    assert stored is not None and stored.status.phase == "Running"
    assert len(store.pods()) == 1


def test_pods_are_ordered_by_namespace_then_name() -> None:
    store = PodStatusStore()
    for namespace, name in [("kube-system", "dns"), ("default", "web"), ("default", "api"),
                            ("apps", "zeta")]:
        store.set(make_pod(name, namespace), RUNNING)
    assert [(p.metadata.namespace, p.metadata.name) for p in store.pods()] == [
        ("apps", "zeta"), ("default", "api"), ("default", "web"), ("kube-system", "dns"),
    ]


def test_remove_forgets_the_pod() -> None:
    store = PodStatusStore()
    web, api = make_pod("web"), make_pod("api")
    store.set(web, RUNNING)
    store.set(api, RUNNING)
    store.remove(web.metadata.uid)
    assert store.get(web.metadata.uid) is None
    assert [p.metadata.name for p in store.pods()] == ["api"]
    store.remove(web.metadata.uid)  # twice is fine


async def test_wait_changed_wakes_on_a_new_status_and_not_on_an_identical_one() -> None:
    store = PodStatusStore()
    pod = make_pod("web")
    async with trio.open_nursery() as nursery:
        watcher = await watching(store, nursery)
        store.set(pod, PENDING)
        await trio.testing.wait_all_tasks_blocked()
        assert watcher.wakeups == 1

        store.set(pod, PENDING.model_copy(deep=True))  # equal, not the same object
        await trio.testing.wait_all_tasks_blocked()
        assert watcher.wakeups == 1

        store.set(pod, RUNNING)
        await trio.testing.wait_all_tasks_blocked()
        assert watcher.wakeups == 2
        nursery.cancel_scope.cancel()


async def test_wait_changed_wakes_on_a_spec_change_with_the_same_status() -> None:
    store = PodStatusStore()
    store.set(make_pod("web"), RUNNING)
    async with trio.open_nursery() as nursery:
        watcher = await watching(store, nursery)
        edited = make_pod("web", image="busybox:1.37")
        store.set(edited, RUNNING)
        await trio.testing.wait_all_tasks_blocked()
        assert watcher.wakeups == 1
        stored = store.get(edited.metadata.uid)
        assert stored is not None and stored.spec.containers[0].image == "busybox:1.37"
        nursery.cancel_scope.cancel()


async def test_wait_changed_wakes_on_remove_of_a_known_pod_only() -> None:
    store = PodStatusStore()
    pod = make_pod("web")
    store.set(pod, RUNNING)
    async with trio.open_nursery() as nursery:
        watcher = await watching(store, nursery)
        store.remove("no-such-uid")
        await trio.testing.wait_all_tasks_blocked()
        assert watcher.wakeups == 0
        store.remove(pod.metadata.uid)
        await trio.testing.wait_all_tasks_blocked()
        assert watcher.wakeups == 1
        nursery.cancel_scope.cancel()


async def test_every_waiter_is_woken() -> None:
    store = PodStatusStore()
    async with trio.open_nursery() as nursery:
        watchers = [await watching(store, nursery) for _ in range(3)]
        store.set(make_pod("web"), RUNNING)
        await trio.testing.wait_all_tasks_blocked()
        assert [w.wakeups for w in watchers] == [1, 1, 1]
        nursery.cancel_scope.cancel()


def test_a_metadata_only_change_is_stored() -> None:
    store = PodStatusStore()
    store.set(make_pod("web", labels={"tier": "v1"}), RUNNING)
    store.set(make_pod("web", labels={"tier": "v2"}), RUNNING)
    stored = store.get("uid-default-web")
    assert stored is not None and stored.metadata.labels == {"tier": "v2"}

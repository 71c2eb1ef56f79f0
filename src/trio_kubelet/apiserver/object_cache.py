"""The ConfigMaps or Secrets the node's pods reference, kept current (the Go watch-based manager).

The Node authorizer lets a node read only the objects that a pod bound to it references, and
only one by one, so every referenced object gets its own list+watch
(``fieldSelector=metadata.name=<name>`` in its namespace), counted by the pods that reference
it: started with the first such pod, cancelled with the last. ``get`` answers from memory —
the object, or the reason there is none: ``NotFound`` (remembered like an object),
``Forbidden`` as the API server said it, ``NotSynced`` before the first answer. A pod worker
asks ``unanswered`` first: while an object it needs has had no answer, the pod waits (it is
not an error, the watch has only just started) and the worker is woken by the answer.

Unlike the Go manager, watches of immutable objects are not stopped: few objects are
immutable, and one idle watch each is cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Literal

import trio

from trio_kubelet.apiserver.client import JSON, APIClient, WatchEvent
from trio_kubelet.apiserver.errors import APIError, Forbidden, NotFound, Unauthorized
from trio_kubelet.apiserver.reflector import Reflector
from trio_kubelet.apiserver.services import ServiceCache
from trio_kubelet.core.objects import ClusterLookup, ObjectKind, ObjectLookup, ObjectUnavailable
from trio_kubelet.core.phase import is_static_pod
from trio_kubelet.core.references import pod_references
from trio_kubelet.model.pod import Pod

Resource = Literal["configmaps", "secrets"]
# The Node authorizer learns of a new pod from its own watch, a moment after the pod can be
# seen: a first list it denies is asked again at these delays (s) before the denial counts,
# instead of after the Reflector's 30 s wait for 403s.
FORBIDDEN_RETRIES = (0.1, 0.2, 0.4, 0.8, 1.6)
# How long a pod worker waits for the Services' first list before building an environment.
SERVICES_WAIT = 2.0


class ObjectCacheError(Exception):
    """The cache has no answer for the object (API answers are raised as APIError)."""


class NotRegistered(ObjectCacheError):
    """No registered pod references the object, so it is not watched (nor readable by the node)."""


class NotSynced(ObjectCacheError):
    """The object's first list has not answered yet."""


@dataclass(eq=False)
class _Entry:
    """One watched object; also the Reflector's handler for it."""

    namespace: str
    name: str
    refs: int = 0
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    answered: bool = False  # listed, or the list failed
    listed: bool = False
    object: JSON | None = None
    error: APIError | None = None  # of the latest list, cleared by a successful one
    waiters: set[Callable[[], None]] = field(default_factory=set)  # told of the first answer

    async def replace(self, items: list[JSON]) -> None:
        self.object = next((item for item in items if self._is_it(item)), None)
        self.listed = True
        self.error = None
        self._answer()

    async def apply(self, event: WatchEvent) -> None:
        if self._is_it(event.object):
            self.object = None if event.type == "DELETED" else event.object

    def failed(self, error: APIError) -> None:
        self.error = error
        self._answer()

    def _answer(self) -> None:
        self.answered = True
        waiters, self.waiters = self.waiters, set()
        for wake in waiters:
            wake()

    def _is_it(self, obj: JSON) -> bool:
        meta = obj.get("metadata")
        return isinstance(meta, dict) and meta.get("name") == self.name


class _EntryReflector(Reflector):
    """A Reflector that also tells its entry why a list failed (the Reflector only logs it)."""

    def __init__(self, client: APIClient, path: str, entry: _Entry, what: str) -> None:
        super().__init__(
            client, path, entry, params={"fieldSelector": f"metadata.name={entry.name}"}, what=what
        )
        self.entry = entry

    async def list_all(self) -> None:
        retries = iter(() if self.listed.is_set() else FORBIDDEN_RETRIES)
        while True:
            try:
                await super().list_all()
                return
            except Forbidden as err:
                delay = next(retries, None)
                if delay is None:
                    self.entry.failed(err)
                    raise
                await trio.sleep(delay)
            except APIError as err:
                self.entry.failed(err)
                raise


class ObjectCache:
    """The referenced objects of one resource (ConfigMaps or Secrets) for the node's pods.

    ``register_pod``/``unregister_pod`` never block, so the pod source can call them as its set
    changes; the watches run in ``run``'s nursery (started with ``nursery.start``).
    """

    def __init__(self, client: APIClient, resource: Resource) -> None:
        self.client = client
        self.resource: Resource = resource
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._pods: dict[str, tuple[str, frozenset[str]]] = {}  # uid → namespace, names
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the watches until cancelled; pods registered before start are watched now."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for entry in self._entries.values():
                self._start(entry)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def register_pod(self, pod: Pod) -> None:
        """Watch what ``pod`` references now; a new version of a known pod replaces its names.

        New references are taken before old ones are dropped, so an object both versions use
        keeps its watch.
        """
        refs = pod_references(pod)
        names = refs.config_maps if self.resource == "configmaps" else refs.secrets
        uid, namespace = pod.metadata.uid, pod.metadata.namespace
        previous = self._pods.pop(uid, None)
        if names:
            self._pods[uid] = (namespace, names)
            for name in names:
                self._acquire(namespace, name)
        if previous is not None:
            for name in previous[1]:
                self._release(previous[0], name)

    def unregister_pod(self, uid: str) -> None:
        """The pod is gone from the node: drop its references (unknown UIDs are ignored)."""
        previous = self._pods.pop(uid, None)
        if previous is not None:
            for name in previous[1]:
                self._release(previous[0], name)

    def get(self, namespace: str, name: str) -> JSON:
        """The object as last seen; shared with the cache, so callers must not modify it.

        Raises ``NotRegistered``, ``NotSynced``, ``NotFound``, or the error of the latest
        list: always when access is denied (``Forbidden``/``Unauthorized``), others only
        until a first list succeeded (afterwards the last object seen is served).
        """
        entry = self._entry(namespace, name)
        error = entry.error
        if error is not None and (not entry.listed or isinstance(error, Forbidden | Unauthorized)):
            raise error.with_traceback(None)
        if not entry.listed:
            raise NotSynced(f"{self._what(namespace, name)}: not listed yet")
        if entry.object is None:
            raise NotFound(404, "NotFound", f'{self.resource} "{name}" not found')
        return entry.object

    def unanswered(
        self, namespace: str, names: Collection[str], wake: Callable[[], None]
    ) -> list[str]:
        """Those of ``names`` still waiting for their first answer (object, absence or error),
        as ``configmaps ns/name``; ``wake`` is called (once) when each of them has one.

        Names no pod references are not waited for: ``get`` says why they cannot be read.
        """
        waiting = []
        for name in sorted(names):
            entry = self._entries.get((namespace, name))
            if entry is not None and not entry.answered:
                entry.waiters.add(wake)
                waiting.append(self._what(namespace, name))
        return waiting

    def _entry(self, namespace: str, name: str) -> _Entry:
        entry = self._entries.get((namespace, name))
        if entry is None:
            raise NotRegistered(f"{self._what(namespace, name)}: no pod on this node references it")
        return entry

    def _acquire(self, namespace: str, name: str) -> None:
        entry = self._entries.get((namespace, name))
        if entry is None:
            entry = self._entries[namespace, name] = _Entry(namespace, name)
            if self._nursery is not None:
                self._start(entry)
        entry.refs += 1

    def _release(self, namespace: str, name: str) -> None:
        entry = self._entries[namespace, name]
        entry.refs -= 1
        if entry.refs == 0:
            del self._entries[namespace, name]
            entry.scope.cancel()

    def _start(self, entry: _Entry) -> None:
        assert self._nursery is not None
        entry.scope = trio.CancelScope()  # a scope is entered once; run() may run again
        what = self._what(entry.namespace, entry.name)
        self._nursery.start_soon(self._watch, entry, name=f"watch {what}")

    async def _watch(self, entry: _Entry) -> None:
        what = self._what(entry.namespace, entry.name)
        path = f"/api/v1/namespaces/{entry.namespace}/{self.resource}"
        with entry.scope:
            await _EntryReflector(self.client, path, entry, what).run()

    def _what(self, namespace: str, name: str) -> str:
        return f"{self.resource} {namespace}/{name}"


class PodObjects:
    """The caches as pod workers use them: a lookup for the pure code, and what to wait for.

    ``lookup`` reads ConfigMaps and Secrets and, given the Services cache, is a
    ``ClusterLookup`` that lists Services too (containers' link variables). ``unanswered``
    names the objects a new pod refers to that the caches are still listing: the worker
    sets up nothing until they have answered, and is woken then, instead of failing the
    pod's volumes as not synced and retrying 10 s later. ``wait_for_services`` gives the
    Services' first list a moment before a container's environment is built.
    """

    def __init__(
        self, config_maps: ObjectCache, secrets: ObjectCache, services: ServiceCache | None = None
    ) -> None:
        self._caches = {"ConfigMap": config_maps, "Secret": secrets}
        self._services = services
        self.lookup: ObjectLookup = (
            self._read if services is None else ClusterLookup(self._read, services)
        )

    def _read(self, kind: ObjectKind, namespace: str, name: str) -> JSON | None:
        try:
            return self._caches[kind].get(namespace, name)
        except NotFound:
            return None
        except (ObjectCacheError, APIError) as err:
            raise ObjectUnavailable(f"cannot read {kind} {namespace}/{name}: {err}") from None

    def unanswered(self, pod: Pod, wake: Callable[[], None]) -> list[str]:
        """The ConfigMaps and Secrets ``pod`` refers to that have had no first answer yet;
        ``wake`` is called as each gets one."""
        refs = pod_references(pod)
        namespace = pod.metadata.namespace
        return [
            *self._caches["ConfigMap"].unanswered(namespace, refs.config_maps, wake),
            *self._caches["Secret"].unanswered(namespace, refs.secrets, wake),
        ]

    async def wait_for_services(self, pod: Pod, *, timeout: float = SERVICES_WAIT) -> None:
        """Wait up to ``timeout`` for the Services' first list (a pod from the API server
        cannot start without ``KUBERNETES_SERVICE_HOST``; the lookup says so after that).

        Static pods never wait: they may run before the API server can answer.
        """
        if self._services is not None and not is_static_pod(pod):
            await self._services.wait_synced(timeout)

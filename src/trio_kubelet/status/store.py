"""The latest API status of every pod the agent runs, for readers that are not the reconciler.

Workers write a pod's status after each sync; the terminal watcher (and later
the HTTP server and the API-server status manager) read it. Readers never
trigger runtime calls.
"""

from __future__ import annotations

import trio

from trio_kubelet.model.pod import Pod, PodStatus


class PodStatusStore:
    def __init__(self) -> None:
        self._pods: dict[str, Pod] = {}
        self._stopped: set[str] = set()
        self._changed = trio.Event()
        # Bumped on every change to what pods() returns: readers that derive something from
        # the pods (the /pods body) keep it while the version stays the same.
        self.version = 0

    def set(self, pod: Pod, status: PodStatus, *, stopped: bool = False) -> None:
        """Record ``status`` for ``pod``; readers are woken only when something changed.

        ``stopped``: nothing of the pod runs on the node any more (no running
        container, no ready sandbox) - what a graceful deletion waits for.
        """
        uid = pod.metadata.uid
        current = self._pods.get(uid)
        was_stopped = uid in self._stopped
        if stopped:
            self._stopped.add(uid)
        else:
            self._stopped.discard(uid)
        if (
            current is not None
            and was_stopped == stopped
            and current.status == status
            and current.spec == pod.spec
            and current.metadata == pod.metadata
        ):
            return
        self._pods[uid] = pod.model_copy(update={"status": status})
        self._notify()

    def remove(self, uid: str) -> None:
        self._stopped.discard(uid)
        if self._pods.pop(uid, None) is not None:
            self._notify()

    def is_stopped(self, uid: str) -> bool:
        return uid in self._stopped

    def get(self, uid: str) -> Pod | None:
        return self._pods.get(uid)

    def pods(self) -> list[Pod]:
        """Every pod with its latest status, ordered by namespace and name."""
        return sorted(self._pods.values(), key=lambda p: (p.metadata.namespace, p.metadata.name))

    async def wait_changed(self) -> None:
        """Return after the next change to any pod's status."""
        await self._changed.wait()

    def next_change(self) -> trio.Event:
        """The event the next change to any pod's status sets."""
        return self._changed

    def _notify(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = trio.Event()

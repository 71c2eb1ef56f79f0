"""Merging the pod sets of all sources into the wanted pods (the Go kubelet's PodConfig).

Pure bookkeeping, no tasks: the sync loop and the replayer both feed it events
and act on the changes it returns, so a replay reconstructs the same desired
state the agent had.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from trio_kubelet.events import PodSetUpdate
from trio_kubelet.model.pod import Pod

log = logging.getLogger("trio_kubelet.podconfig")


@dataclass(frozen=True, slots=True)
class Change:
    """The pod with this UID is now wanted as ``pod``, or no longer wanted (``None``)."""

    uid: str
    pod: Pod | None


class PodConfig:
    def __init__(self, sources: Iterable[str]) -> None:
        self._expected_sources = set(sources)
        self._pod_sets: dict[str, dict[str, Pod]] = {}
        # Pods the runtime holds that no source has claimed (yet).
        self._unclaimed: set[str] = set()

    @property
    def sources_ready(self) -> bool:
        """Every configured source has reported at least once."""
        return self._expected_sources <= self._pod_sets.keys()

    def pod_sets(self) -> dict[str, dict[str, Pod]]:
        """Each source's current pods by UID."""
        return {source: dict(pods) for source, pods in self._pod_sets.items()}

    def desired(self) -> dict[str, Pod]:
        """Every pod some source wants, by UID (the first source wins on a UID clash)."""
        merged: dict[str, Pod] = {}
        for pods in self._pod_sets.values():
            for uid, pod in pods.items():
                merged.setdefault(uid, pod)
        return merged

    def apply(self, update: PodSetUpdate) -> list[Change]:
        """Take a source's complete pod set; return what changed for the node."""
        was_ready = self.sources_ready
        old = self._pod_sets.get(update.source, {})
        new = {pod.metadata.uid: pod for pod in update.pods}
        self._pod_sets[update.source] = new
        changes: list[Change] = []
        for uid, pod in new.items():
            if old.get(uid) != pod:
                verb = "Updated" if uid in old else "Added"
                log.info("%s pod %s (%s) from source %s", verb, pod.full_name, uid, update.source)
                changes.append(Change(uid, pod))
        desired = self.desired()
        for uid in old.keys() - new.keys():
            if uid not in desired:
                log.info(
                    "Removed pod %s (%s) from source %s", old[uid].full_name, uid, update.source
                )
                changes.append(Change(uid, None))
        if self.sources_ready and not was_ready:
            log.info("All pod sources are ready")
            for uid in sorted(self._unclaimed - desired.keys()):
                log.info("Pod %s is on the runtime but in no source: tearing it down", uid)
                changes.append(Change(uid, None))
            self._unclaimed.clear()
        return changes

    def runtime_pod_seen(self, uid: str) -> list[Change]:
        """The runtime holds pod ``uid`` and nothing is running it: tear it down once safe.

        Before every source has reported, the pod may still be claimed (a restarted
        agent adopting its pods), so the decision waits until the sources are ready.
        """
        if uid in self.desired():
            return []
        if not self.sources_ready:
            self._unclaimed.add(uid)
            return []
        return [Change(uid, None)]

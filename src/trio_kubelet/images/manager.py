"""Making a container's image present according to its pull policy, with pull backoff."""

from __future__ import annotations

import logging
import math

import trio

from trio_kubelet.core.backoff import Backoff
from trio_kubelet.kube_events import EventRecorder, EventType, ObjectRef
from trio_kubelet.model.duration import format_duration
from trio_kubelet.model.pod import Container
from trio_kubelet.runtime.client import CRIClient
from trio_kubelet.runtime.errors import CRIError

log = logging.getLogger("trio_kubelet.images")


class ImageError(Exception):
    """The image could not be made present; ``reason`` is what kubectl shows as waiting reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class ImageManager:
    """Shared by every pod worker: one pull backoff per pod and image, as in the Go kubelet."""

    def __init__(self, client: CRIClient, events: EventRecorder | None = None) -> None:
        self._client = client
        self.events = events if events is not None else EventRecorder()
        self._backoff = Backoff()
        self._failed_at: dict[str, float] = {}

    async def ensure(
        self, container: Container, pod_uid: str, now: float, ref: ObjectRef | None = None
    ) -> str:
        """The runtime's reference (image ID) for the container's image; pulls if needed.

        ``ref`` is the container the Kubernetes Events are about (none without it).
        """
        image = container.image
        present = await self._client.image_status(image)
        policy = container.image_pull_policy
        if present is not None and policy != "Always":
            message = f'Container image "{image}" already present on machine'
            self._event(ref, "Normal", "Pulled", message)
            return present.id
        if policy == "Never":
            message = f'Container image "{image}" is not present with pull policy of Never'
            self._event(ref, "Warning", "ErrImageNeverPull", message)
            raise ImageError("ErrImageNeverPull", message)
        key = f"{pod_uid}_{image}"
        failed_at = self._failed_at.get(key)
        if failed_at is not None and self._backoff.in_backoff(key, failed_at, now) > 0:
            message = f'Back-off pulling image "{image}"'
            self._event(ref, "Normal", "BackOff", message)
            raise ImageError("ImagePullBackOff", message)
        log.info("Pulling image %s", image)
        self._event(ref, "Normal", "Pulling", f'Pulling image "{image}"', logged=True)
        started = trio.current_time()
        try:
            image_ref = await self._client.pull_image(image)
        except CRIError as err:
            message = f'Failed to pull image "{image}": {err}'
            if present is not None:  # Always with the image present: a failed refresh is not fatal
                log.warning("Pulling image %s failed, using the present one: %s", image, err)
                self._event(ref, "Warning", "Failed", message, logged=True)
                return present.id
            self._failed_at[key] = now
            self._backoff = self._backoff.next(key, now)
            self._event(ref, "Warning", "Failed", message)
            raise ImageError("ErrImagePull", message) from err
        self._failed_at.pop(key, None)
        log.info("Successfully pulled image %s", image)
        if ref is not None:
            took = format_duration(math.floor((trio.current_time() - started) * 1000) / 1000)
            size = await self._image_size(image)
            message = (
                f'Successfully pulled image "{image}" in {took} ({took} including waiting). '
                f"Image size: {size} bytes."
            )
            self._event(ref, "Normal", "Pulled", message, logged=True)
        return image_ref

    async def _image_size(self, image: str) -> int:
        """Best effort, as the Go kubelet's: 0 when the runtime cannot say."""
        try:
            status = await self._client.image_status(image)
        except CRIError:
            return 0
        return status.size if status is not None else 0

    def _event(
        self,
        ref: ObjectRef | None,
        type: EventType,
        reason: str,
        message: str,
        *,
        logged: bool = False,
    ) -> None:
        if ref is not None:
            self.events.event(ref, type, reason, message, logged=logged)

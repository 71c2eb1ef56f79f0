"""Making a container's image present according to its pull policy, with pull backoff."""

from __future__ import annotations

import logging

from trio_kubelet.core.backoff import Backoff
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

    def __init__(self, client: CRIClient) -> None:
        self._client = client
        self._backoff = Backoff()
        self._failed_at: dict[str, float] = {}

    async def ensure(self, container: Container, pod_uid: str, now: float) -> str:
        """The runtime's reference (image ID) for the container's image; pulls if needed."""
        image = container.image
        present = await self._client.image_status(image)
        policy = container.image_pull_policy
        if present is not None and policy != "Always":
            return present.id
        if policy == "Never":
            raise ImageError(
                "ErrImageNeverPull",
                f'Container image "{image}" is not present with pull policy of Never',
            )
        key = f"{pod_uid}_{image}"
        failed_at = self._failed_at.get(key)
        if failed_at is not None and self._backoff.in_backoff(key, failed_at, now) > 0:
            raise ImageError("ImagePullBackOff", f'Back-off pulling image "{image}"')
        log.info("Pulling image %s", image)
        try:
            ref = await self._client.pull_image(image)
        except CRIError as err:
            if present is not None:  # Always with the image present: a failed refresh is not fatal
                log.warning("Pulling image %s failed, using the present one: %s", image, err)
                return present.id
            self._failed_at[key] = now
            self._backoff = self._backoff.next(key, now)
            raise ImageError("ErrImagePull", f'Failed to pull image "{image}": {err}') from err
        self._failed_at.pop(key, None)
        log.info("Successfully pulled image %s", image)
        return ref

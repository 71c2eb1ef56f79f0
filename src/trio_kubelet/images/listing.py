"""The runtime's images as the Node's status lists them: a listing kept fresh every 30 s (Go's
image cache for status.images; GC lists on its own, far less often)."""

from __future__ import annotations

import logging
from typing import Protocol

import trio

from trio_kubelet.core.image_gc import ListedImage
from trio_kubelet.runtime.cri.runtime import v1
from trio_kubelet.runtime.errors import CRIError

log = logging.getLogger(__name__)

LIST_PERIOD = 30.0


class ImageLister(Protocol):
    async def list_images(self, *, call_timeout: float | None = None) -> list[v1.Image]: ...


class NodeImages:
    """``latest``: the images of the last listing that worked (None before the first)."""

    def __init__(self, client: ImageLister, period: float = LIST_PERIOD) -> None:
        self._client = client
        self._period = period
        self.latest: tuple[ListedImage, ...] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                images = await self._client.list_images()
            except CRIError as err:
                log.warning("Cannot list images for the node status: %s", err)
            else:
                self.latest = tuple(
                    ListedImage(
                        image.id,
                        image.size,
                        image.pinned,
                        tuple(image.repo_tags),
                        tuple(image.repo_digests),
                    )
                    for image in images
                )
            await trio.sleep(self._period)
